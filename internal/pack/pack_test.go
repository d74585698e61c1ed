package pack

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

func mustGet(t *testing.T, dataDir, tag string) *snapshot.Snapshot {
	t.Helper()
	store, err := snapshot.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Get(tag)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ranges returns a file's allocated ranges and allocated bytes.
func ranges(t *testing.T, path string) ([]Extent, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	r, err := dataRanges(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	return r, fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func covered(outer []Extent, off, n int64) bool {
	for _, e := range outer {
		if off >= e.Off() && off+n <= e.End() {
			return true
		}
	}
	return false
}

func TestRoundTrip(t *testing.T) {
	src, fake := makeDataDir(t, "base", 256*mib)
	orig := mustGet(t, src, "base")
	archive, pst := packBytes(t, src, "base", PackOptions{})
	t.Logf("pack: %+v", pst)
	if pst.Files != 5 || pst.LogicalBytes != 256*mib+8*mib+96<<10+10<<10 {
		t.Errorf("pack stats %+v", pst)
	}
	// The memory's four root fs pages and its repeated page are copies.
	if pst.CopiedBytes < 5*pageSize {
		t.Errorf("copied %d bytes, want at least the 5 duplicate pages", pst.CopiedBytes)
	}
	if int64(len(archive)) > 8*mib {
		t.Errorf("archive of a snapshot with ~4 MiB of data is %d bytes", len(archive))
	}

	dst := t.TempDir()
	snap, ust, err := Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unpack: %+v", ust)
	digest := orig.Image.Digest
	if ust.Files != 5 || ust.LogicalBytes != pst.LogicalBytes || ust.ArchiveBytes != int64(len(archive)) || !slices.Equal(ust.ImagesAdded, []string{digest}) {
		t.Errorf("unpack stats %+v", ust)
	}

	// The snapshot: same content, new ID, this data dir's image paths.
	got := mustGet(t, dst, "base")
	if got.ID == orig.ID || got.ID != snap.ID || snap.Dir != filepath.Join(dst, "snapshots", "base") {
		t.Errorf("unpacked snapshot id %s dir %s (original id %s)", snap.ID, snap.Dir, orig.ID)
	}
	imgDir := filepath.Join(dst, "images", digest)
	if got.Image.Kernel != filepath.Join(imgDir, "vmlinuz") || got.Image.Initrd != filepath.Join(imgDir, "initrd.img") || got.Image.Rootfs != filepath.Join(imgDir, "rootfs.ext4") {
		t.Errorf("image paths %+v", got.Image)
	}
	if got.VMM != orig.VMM || got.MemoryMiB != orig.MemoryMiB || !got.Created.Equal(orig.Created) || len(got.Files) != len(orig.Files) {
		t.Errorf("manifest changed: %+v, was %+v", got.Manifest, orig.Manifest)
	}
	if err := got.Verify(); err != nil {
		t.Error(err)
	}
	for name, want := range orig.Files {
		fi, err := os.Stat(got.Path(name))
		if err != nil || fi.Mode().Perm() != 0o400 || got.Files[name] != want {
			t.Errorf("%s: %v mode %v entry %+v want %+v", name, err, fi.Mode(), got.Files[name], want)
		}
	}

	// The image: loadable by the image package, identical files.
	img, err := image.Open(dst, digest)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range img.Files {
		size, sum, err := fsutil.HashFile(filepath.Join(imgDir, name))
		fi, _ := os.Stat(filepath.Join(imgDir, name))
		if err != nil || size != want.Size || sum != want.SHA256 || fi.Mode().Perm() != 0o444 {
			t.Errorf("image file %s: %v %d %s mode %v", name, err, size, sum, fi.Mode())
		}
	}

	// Holes stay holes; the allocated zero run became one.
	for _, name := range []string{snapshot.MemoryFile} {
		or, oblocks := ranges(t, orig.Path(name))
		cr, cblocks := ranges(t, got.Path(name))
		for _, e := range cr {
			if !covered(or, e.Off(), e.Len()) {
				t.Errorf("%s: [%d, +%d) is allocated in the copy but a hole in the original %v", name, e.Off(), e.Len(), or)
			}
		}
		if covered(cr, fake.zeroRun.Off(), pageSize) {
			t.Errorf("%s: the allocated zero run at %d was not turned into a hole: %v", name, fake.zeroRun.Off(), cr)
		}
		if cblocks > oblocks {
			t.Errorf("%s: copy allocates %d bytes, the original %d", name, cblocks, oblocks)
		}
		t.Logf("%s: original %d bytes allocated in %d ranges, copy %d in %d", name, oblocks, len(or), cblocks, len(cr))
	}
	assertClean(t, dst, []string{"base"}, []string{digest})
}

func TestUnpackExistingTag(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	archive, _ := packBytes(t, src, "base", PackOptions{})
	dst := t.TempDir()
	first, _, err := Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	digest := first.Image.Digest

	_, _, err = Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("unpack onto an existing tag: %v, want AlreadyExists", err)
	}
	assertClean(t, dst, []string{"base"}, []string{digest})

	second, st, err := Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.ReplacedID != first.ID || second.ID == first.ID || !slices.Equal(st.ImagesReused, []string{digest}) || len(st.ImagesAdded) != 0 {
		t.Errorf("forced unpack: %+v (first id %s, second %s)", st, first.ID, second.ID)
	}
	if got := mustGet(t, dst, "base"); got.ID != second.ID {
		t.Errorf("tag holds %s after the forced unpack, want %s", got.ID, second.ID)
	}

	other, _, err := Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{Tag: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if other.Tag != "other" || mustGet(t, dst, "other").Verify() != nil {
		t.Errorf("unpack under another tag: %+v", other.Manifest)
	}
	if _, _, err := Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{Tag: "../x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("tag ../x: %v", err)
	}
	assertClean(t, dst, []string{"base", "other"}, []string{digest})
}

func TestPackRefusesChangedSnapshot(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	snap := mustGet(t, src, "base")
	mem := snap.Path(snapshot.MemoryFile)
	os.Chmod(mem, 0o600)
	f, err := os.OpenFile(mem, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xff}, 3*mib) // inside a hole: same size, other hash
	f.Close()
	var buf bytes.Buffer
	_, err = Pack(context.Background(), src, "base", &buf, PackOptions{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "changed since it was created") {
		t.Errorf("pack of a changed snapshot: %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("pack wrote %d bytes before failing", buf.Len())
	}

	if _, err := Pack(context.Background(), src, "nope", &buf, PackOptions{}); !errdefs.IsNotFound(err) {
		t.Errorf("pack of an unknown tag: %v", err)
	}
	os.RemoveAll(filepath.Join(src, "images", snap.Image.Digest))
	if _, err := Pack(context.Background(), src, "base", &buf, PackOptions{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("pack without the image: %v", err)
	}
}

func TestPackCanceled(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Pack(ctx, src, "base", &bytes.Buffer{}, PackOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("pack with a canceled context: %v", err)
	}
	archive, _ := packBytes(t, src, "base", PackOptions{})
	dst := t.TempDir()
	if _, _, err := Unpack(ctx, dst, bytes.NewReader(archive), UnpackOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("unpack with a canceled context: %v", err)
	}
	assertClean(t, dst, nil, nil)
}

func TestExcludeImages(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	full, _ := packBytes(t, src, "base", PackOptions{})
	slim, st := packBytes(t, src, "base", PackOptions{ExcludeImages: true, Concurrency: 1})
	if len(slim) > len(full)-64<<10 { // the image holds over 64 KiB of random bytes
		t.Errorf("archive without the image is %d bytes, with it %d", len(slim), len(full))
	}
	if st.CopiedBytes < 4*pageSize {
		t.Errorf("copied %d bytes: the root fs pages in memory should still be copies", st.CopiedBytes)
	}

	// Without the image here, unpack refuses before writing anything.
	dst := t.TempDir()
	_, _, err := Unpack(context.Background(), dst, bytes.NewReader(slim), UnpackOptions{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "packed without image") {
		t.Errorf("unpack without the image: %v", err)
	}
	assertClean(t, dst, nil, nil)

	// With it (from the full archive), the memory's copies read from it.
	first, _, err := Unpack(context.Background(), dst, bytes.NewReader(full), UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	snap, ust, err := Unpack(context.Background(), dst, bytes.NewReader(slim), UnpackOptions{Tag: "slim"})
	if err != nil {
		t.Fatal(err)
	}
	if err := mustGet(t, dst, "slim").Verify(); err != nil {
		t.Error(err)
	}
	if !slices.Equal(ust.ImagesReused, []string{first.Image.Digest}) || snap.Image.Rootfs != first.Image.Rootfs {
		t.Errorf("slim unpack: %+v, rootfs %s", ust, snap.Image.Rootfs)
	}
}
