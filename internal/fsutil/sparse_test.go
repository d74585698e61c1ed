package fsutil

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadSparseInto reads a sparse file into a zeroed buffer and gets
// every byte, and DataExtents names only its data runs.
func TestReadSparseInto(t *testing.T) {
	const mib = 1 << 20
	f, err := os.Create(filepath.Join(t.TempDir(), "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(8 * mib); err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte{1}, mib), 2*mib)
	f.WriteAt(bytes.Repeat([]byte{2}, 4096), 7*mib)
	var data int64
	if err := DataExtents(f, 8*mib, func(d, h int64) error { data += h - d; return nil }); err != nil {
		t.Fatal(err)
	}
	// File systems may round extents up to their block size.
	if data < mib+4096 || data > 2*mib {
		t.Errorf("data extents cover %d bytes, want about %d", data, mib+4096)
	}
	buf := make([]byte, 8*mib)
	n, err := ReadSparseInto(buf, f)
	if err != nil {
		t.Fatal(err)
	}
	if n != data {
		t.Errorf("read %d bytes, data extents %d", n, data)
	}
	want := make([]byte, 8*mib)
	if _, err := f.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("buffer differs from the file")
	}
	// A buffer shorter than the file reads only its length.
	short := make([]byte, 2*mib+100)
	if _, err := ReadSparseInto(short, f); err != nil || short[2*mib+99] != 1 {
		t.Fatalf("short buffer: %v, last byte %d", err, short[2*mib+99])
	}
}

// TestCopyRangeKeepsZerosAsHoles: the read/write fallback of CopySparse
// does not write pages of zeros, so a source that reports all its size as
// data (hugetlbfs) still gives a sparse copy with the same bytes.
func TestCopyRangeKeepsZerosAsHoles(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "dense"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	data := make([]byte, 3*mib+100) // not a whole number of pages
	copy(data[mib+4096:], bytes.Repeat([]byte{5}, 8192))
	data[len(data)-1] = 9
	if _, err := src.Write(data); err != nil { // dense: zeros written
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(dir, "copy"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	dst.Truncate(int64(len(data)))
	if n, w, err := copyRange(dst, src, 0, int64(len(data))); err != nil || n != int64(len(data)) || w != 8192+100 { // two pages of 5s, and the last 100 bytes (a partial page holding the 9)
		t.Fatalf("copyRange: read %d, wrote %d, %v", n, w, err)
	}
	got, err := os.ReadFile(dst.Name())
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("copy differs (%v)", err)
	}
	off, err := unix.Seek(int(dst.Fd()), 0, unix.SEEK_DATA)
	if err != nil {
		t.Skipf("no SEEK_DATA here: %v", err)
	}
	if off < mib {
		t.Errorf("first data at %d: the leading zeros were written", off)
	}
}

// TestCopyCompactLeavesZeroPagesOut: unlike CopySparse (copy_file_range
// copies allocated zeros), CopyCompact leaves src's pages of zeros as
// holes, and keeps its holes.
func TestCopyCompactLeavesZeroPagesOut(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	size := int64(8 * mib)
	src.Truncate(size)
	zeros := make([]byte, 2*mib)
	src.WriteAt(zeros, mib) // allocated zeros at [1, 3) MiB
	src.WriteAt(bytes.Repeat([]byte{7}, 4096), 2*mib)
	src.WriteAt(bytes.Repeat([]byte{8}, 4096), 6*mib) // alone in a hole
	want, _ := os.ReadFile(src.Name())
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, err := CopyCompact(dst, src, size)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Skip("the file system made a reflink")
	}
	got, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs")
	}
	var allocated int64
	DataExtents(dst, size, func(data, hole int64) error { allocated += hole - data; return nil })
	if allocated > 64<<10 {
		t.Errorf("%d bytes allocated for two pages of data", allocated)
	}
}
