package fsutil

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
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
