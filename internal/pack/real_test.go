package pack

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// raceEnabled: the race detector slows everything down tenfold, so
// throughput targets are not checked.
var raceEnabled bool

// realDataDir is a data directory with real snapshots (the development
// host's); tests that need one skip without it.
func realDataDir(t testing.TB, tag string) string {
	dir := os.Getenv("FORKD_PACK_DATA_DIR")
	if dir == "" {
		dir = "/var/tmp/forkd-dev"
	}
	if _, err := os.Stat(filepath.Join(dir, "snapshots", tag, "manifest.json")); err != nil {
		t.Skipf("no snapshot %s in %s (set FORKD_PACK_DATA_DIR)", tag, dir)
	}
	return dir
}

// TestPackRealThroughput measures Pack on the idle py-pandas snapshot of
// the development host: throughput and size, with and without its image.
func TestPackRealThroughput(t *testing.T) {
	const tag = "bench-py-pandas"
	if testing.Short() {
		t.Skip("packs 900 MB three times")
	}
	dir := realDataDir(t, tag)
	snap, err := readSnapshot(dir, tag)
	if err != nil {
		t.Fatal(err)
	}
	var snapLogical int64
	for _, f := range snap.Files {
		snapLogical += f.Size
	}
	for _, c := range []struct {
		conc    int
		exclude bool
	}{{1, false}, {2, false}, {2, true}} {
		start := time.Now()
		st, err := Pack(context.Background(), dir, tag, io.Discard, PackOptions{Concurrency: c.conc, ExcludeImages: c.exclude})
		if err != nil {
			t.Fatal(err)
		}
		d := time.Since(start).Seconds()
		t.Logf("concurrency %d, exclude images %v: %d files, %.0f MB logical, %.0f MB stored, %.0f MB copied, %.1f MB archive (%.1fx logical, %.1fx the snapshot's %.0f MB), scan %.2fs, total %.2fs: %.0f MB/s logical",
			c.conc, c.exclude, st.Files, float64(st.LogicalBytes)/1e6, float64(st.StoredBytes)/1e6, float64(st.CopiedBytes)/1e6, float64(st.ArchiveBytes)/1e6,
			float64(st.LogicalBytes)/float64(st.ArchiveBytes), float64(snapLogical)/float64(st.ArchiveBytes), float64(snapLogical)/1e6,
			st.ScanDuration.Seconds(), d, float64(st.LogicalBytes)/1e6/d)
		if c.conc == 2 && !raceEnabled && float64(st.LogicalBytes)/1e6/d < 300 {
			t.Errorf("pack ran at %.0f MB/s, under the 300 MB/s target", float64(st.LogicalBytes)/1e6/d)
		}
		if c.exclude && float64(snapLogical)/float64(st.ArchiveBytes) < 10 {
			t.Errorf("snapshot packed %.1fx smaller, under the 10x target", float64(snapLogical)/float64(st.ArchiveBytes))
		}
	}
}

// TestRealRoundTrip packs the real py-pandas snapshot, unpacks it into an
// empty data directory, and checks every file; then unpacks the archive
// made without the image next to it, whose memory copies pages from the
// image unpacked before.
func TestRealRoundTrip(t *testing.T) {
	const tag = "bench-py-pandas"
	if testing.Short() {
		t.Skip("writes 1.5 GB")
	}
	dir := realDataDir(t, tag)
	orig, err := readSnapshot(dir, tag)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	full := filepath.Join(work, "full.tar.zst")
	slim := filepath.Join(work, "slim.tar.zst")
	for path, opts := range map[string]PackOptions{full: {}, slim: {ExcludeImages: true}} {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Pack(context.Background(), dir, tag, f, opts); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	dst := filepath.Join(work, "data")
	for _, c := range []struct{ path, tag string }{{full, tag}, {slim, "slim"}} {
		f, err := os.Open(c.path)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		snap, st, err := Unpack(context.Background(), dst, f, UnpackOptions{Tag: c.tag})
		f.Close()
		if err != nil {
			t.Fatalf("unpack %s: %v", c.path, err)
		}
		d := time.Since(start).Seconds()
		t.Logf("unpack %s: %.0f MB logical from %.1f MB in %.2fs (%.0f MB/s logical)", filepath.Base(c.path), float64(st.LogicalBytes)/1e6, float64(st.ArchiveBytes)/1e6, d, float64(st.LogicalBytes)/1e6/d)
		if err := snap.Verify(); err != nil {
			t.Error(err)
		}
		if len(snap.Files) != len(orig.Files) || snap.Image.Digest != orig.Image.Digest {
			t.Errorf("unpacked manifest %+v", snap.Manifest)
		}
		for name, want := range orig.Files {
			if snap.Files[name] != want {
				t.Errorf("%s: %+v, want %+v", name, snap.Files[name], want)
			}
		}
	}
}

// BenchmarkPack packs a synthetic 256 MiB snapshot (a few MiB of data).
func BenchmarkPack(b *testing.B) {
	src, _ := makeDataDir(b, "base", 256<<20)
	st, err := Pack(context.Background(), src, "base", io.Discard, PackOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.LogicalBytes)
	for b.Loop() {
		if _, err := Pack(context.Background(), src, "base", io.Discard, PackOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
