package pack

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

const mib = 1 << 20

// fakeSnapshot describes the snapshot makeDataDir creates.
type fakeSnapshot struct {
	tag     string
	memSize int64
	// rootfsPage and dupPage are the memory offsets of a page copied from
	// the root file system and of a page repeating the memory's first page.
	rootfsPage, dupPage int64
	// zeroRun is a range of explicitly written (allocated) zeros.
	zeroRun Extent
}

// makeDataDir builds a data directory holding one image and one snapshot
// the way forkd lays them out, with a sparse memory file of memSize bytes
// (a power of two, at least 1 MiB) that holds about memSize/64 bytes of
// data (random and compressible), pages equal to root file system blocks,
// a repeated page and an allocated zero run.
func makeDataDir(t testing.TB, tag string, memSize int64) (string, fakeSnapshot) {
	t.Helper()
	dir := t.TempDir()
	u := max(memSize/256, pageSize) // the unit of the layout
	rng := rand.New(rand.NewPCG(1, uint64(memSize)))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	text := func(n int) []byte {
		var b bytes.Buffer
		for b.Len() < n {
			fmt.Fprintf(&b, "page %d: import pandas as pd; df = pd.DataFrame(%d)\n", b.Len()/4096, rng.IntN(1000))
		}
		return b.Bytes()[:n]
	}
	writeAt := func(f *os.File, off int64, data []byte) {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	// The image: kernel, initramfs and a root file system with a hole.
	digestSum := sha256.Sum256([]byte(t.Name()))
	digest := hex.EncodeToString(digestSum[:])
	imgDir := filepath.Join(dir, "images", digest)
	if err := os.MkdirAll(imgDir, 0o700); err != nil {
		t.Fatal(err)
	}
	rootfs := append(text(int(max(2*u, 8*pageSize))), random(int(u))...)
	for name, data := range map[string][]byte{"vmlinuz": random(int(u / 16)), "initrd.img": random(int(u / 32))} {
		if err := os.WriteFile(filepath.Join(imgDir, name), data, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	rf, err := os.Create(filepath.Join(imgDir, "rootfs.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	writeAt(rf, 0, rootfs)
	if err := rf.Truncate(8 * u); err != nil { // a hole at the end
		t.Fatal(err)
	}
	rf.Close()
	files := map[string]snapshot.FileEntry{}
	for _, name := range []string{"vmlinuz", "initrd.img", "rootfs.ext4"} {
		p := filepath.Join(imgDir, name)
		size, sum, err := fsutil.HashFile(p)
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o444)
		files[name] = snapshot.FileEntry{Size: size, SHA256: sum}
	}
	im := map[string]any{
		"format_version": 1, "digest": digest,
		"recipe": map[string]any{"name": "fake", "digest": digest},
		"base":   "busybox", "packages": []string{},
		"files": files, "created": time.Now().UTC(),
	}
	imData, _ := json.MarshalIndent(im, "", "  ")
	if err := os.WriteFile(filepath.Join(imgDir, "image.json"), imData, 0o444); err != nil {
		t.Fatal(err)
	}

	// The snapshot.
	store, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	fs := fakeSnapshot{tag: tag, memSize: memSize}
	mf, err := os.Create(st.Path(snapshot.MemoryFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := mf.Truncate(memSize); err != nil {
		t.Fatal(err)
	}
	first := random(int(u))
	writeAt(mf, 0, first)
	writeAt(mf, memSize/4, text(int(2*u)))
	fs.rootfsPage = memSize/4 + 3*u
	writeAt(mf, fs.rootfsPage, rootfs[2*pageSize:6*pageSize]) // four pages of the root fs
	fs.dupPage = fs.rootfsPage + max(u/2, 8*pageSize)
	writeAt(mf, fs.dupPage, first[:pageSize])
	fs.zeroRun = Extent{memSize / 2, max(u, minHole)}
	writeAt(mf, fs.zeroRun.Off(), make([]byte, fs.zeroRun.Len()))
	writeAt(mf, fs.zeroRun.End(), random(int(max(u/2, pageSize))))
	writeAt(mf, memSize-pageSize, random(pageSize))
	mf.Close()
	if err := os.WriteFile(st.Path(snapshot.StateFile), text(10<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = st.Commit(snapshot.Manifest{
		Image: snapshot.ImageRef{
			Digest: digest, Recipe: "fake",
			Kernel: filepath.Join(imgDir, "vmlinuz"), Initrd: filepath.Join(imgDir, "initrd.img"), Rootfs: filepath.Join(imgDir, "rootfs.ext4"),
		},
		VMM: snapshot.VMMRef{Kind: "qemu", Version: "test"}, MemoryMiB: int(memSize >> 20), VCPUs: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir, fs
}

func packBytes(t testing.TB, dataDir, tag string, opts PackOptions) ([]byte, PackStats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := Pack(context.Background(), dataDir, tag, &buf, opts)
	if err != nil {
		t.Fatal(err)
	}
	if st.ArchiveBytes != int64(buf.Len()) {
		t.Fatalf("stats say %d bytes, wrote %d", st.ArchiveBytes, buf.Len())
	}
	return buf.Bytes(), st
}

// entry is one tar entry of a decoded archive.
type entry struct {
	hdr  tar.Header
	data []byte
	raw  []byte // if set, written as is instead of hdr and data
}

// decode splits an archive into its tar entries.
func decode(t testing.TB, archive []byte) []entry {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{hdr: *h, data: data})
	}
}

// encode makes an archive of entries: one zstd frame holding the tar
// stream, with trailer.
func encode(t testing.TB, entries []entry) []byte {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, e := range entries {
		if e.raw != nil {
			tw.Flush()
			tb.Write(e.raw)
			continue
		}
		h := e.hdr
		h.Size = int64(len(e.data))
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeRegA {
			h.Size = 0
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	return enc.EncodeAll(tb.Bytes(), nil)
}

// editManifest rewrites the manifest entry of entries with fn.
func editManifest(t testing.TB, entries []entry, fn func(m *Manifest)) []entry {
	t.Helper()
	var m Manifest
	if err := json.Unmarshal(entries[0].data, &m); err != nil {
		t.Fatal(err)
	}
	fn(&m)
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := append([]entry(nil), entries...)
	out[0].data = data
	return out
}

// assertClean checks that a failed Unpack left nothing behind in a data
// directory that held only the tags in keep: no other tag, no staging or
// trash directory, no image beyond those in images.
func assertClean(t testing.TB, dataDir string, keep []string, images []string) {
	t.Helper()
	want := map[string]bool{snapshot.ChainsLockFile: true}
	for _, k := range keep {
		want[k] = true
	}
	ents, _ := os.ReadDir(filepath.Join(dataDir, "snapshots"))
	for _, e := range ents {
		if !want[e.Name()] {
			t.Errorf("left behind: snapshots/%s", e.Name())
		}
	}
	want = map[string]bool{".locks": true}
	for _, k := range images {
		want[k] = true
	}
	ents, _ = os.ReadDir(filepath.Join(dataDir, "images"))
	for _, e := range ents {
		if !want[e.Name()] {
			t.Errorf("left behind: images/%s", e.Name())
		}
	}
}

// tarHeaderBlock returns a raw tar header block with the given name,
// type flag and size (for entries archive/tar will not write).
func tarHeaderBlock(name string, typeflag byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], "00000000000\x00")
	b[156] = typeflag
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	for i := 148; i < 156; i++ {
		b[i] = ' '
	}
	var sum int
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func pad512(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

// paxRecord formats one PAX record ("%d key=value\n", the length counting
// itself).
func paxRecord(k, v string) string {
	rest := " " + k + "=" + v + "\n"
	n := len(rest) + 1
	for len(fmt.Sprint(n))+len(rest) != n {
		n++
	}
	return fmt.Sprint(n) + rest
}

func isStaging(name string) bool {
	return strings.HasPrefix(name, ".staging-") || strings.HasPrefix(name, ".trash-")
}
