package memlayer

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestApply puts a layer with data pages and zero pages over a base and
// checks every page of the result, and that zero pages became holes.
func TestApply(t *testing.T) {
	const ps, pages = 4096, 64
	dir := t.TempDir()
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, ps) }
	base, err := os.Create(filepath.Join(dir, "base"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < pages; i++ {
		base.WriteAt(page(byte(0x10+i)), int64(i)*ps)
	}
	layer, err := os.Create(filepath.Join(dir, "layer"))
	if err != nil {
		t.Fatal(err)
	}
	layer.Truncate(pages * ps)
	// Pages 5-7 new data, 8-9 written to zeros (holes in the layer), 20
	// new data; everything else comes from the base.
	for _, p := range []int{5, 6, 7, 20} {
		layer.WriteAt(page(0xA0+byte(p)), int64(p)*ps)
	}
	b := Builder{PageSize: ps, MemorySize: pages * ps}
	b.Add(5, 5)
	b.Add(20, 1)
	n, err := Apply(base, layer, b.Index())
	if err != nil {
		t.Fatal(err)
	}
	if n != 4*ps {
		t.Errorf("wrote %d bytes, want %d", n, 4*ps)
	}
	got := make([]byte, ps)
	for i := 0; i < pages; i++ {
		base.ReadAt(got, int64(i)*ps)
		want := page(byte(0x10 + i))
		switch {
		case i >= 5 && i <= 7 || i == 20:
			want = page(0xA0 + byte(i))
		case i == 8 || i == 9:
			want = page(0)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("page %d = %#x..., want %#x...", i, got[0], want[0])
		}
	}
	if off, err := unix.Seek(int(base.Fd()), 8*ps, unix.SEEK_HOLE); err != nil || off != 8*ps {
		t.Errorf("zero pages 8-9 are not a hole: SEEK_HOLE from page 8 = %d, %v", off, err)
	}
	bad := &Index{PageSize: ps, MemorySize: pages * ps, Extents: []Extent{{60, 10}}}
	if _, err := Apply(base, layer, bad); err == nil {
		t.Error("an extent past the memory size was applied")
	}
}

// TestApplyMapped: applying a layer to a mapping of the image gives the
// same bytes as Apply to its file, zero pages included, and refuses an
// index for another memory size.
func TestApplyMapped(t *testing.T) {
	const ps, pages = 4096, 32
	dir := t.TempDir()
	img := make([]byte, pages*ps)
	for i := range img {
		img[i] = byte(i/ps + 1)
	}
	file, err := os.Create(filepath.Join(dir, "image"))
	if err != nil {
		t.Fatal(err)
	}
	file.Write(img)
	layer, err := os.Create(filepath.Join(dir, "layer"))
	if err != nil {
		t.Fatal(err)
	}
	layer.Truncate(pages * ps)
	layer.WriteAt(bytes.Repeat([]byte{0xEE}, 2*ps), 3*ps) // pages 3-4 data, 5 zeros
	layer.WriteAt(bytes.Repeat([]byte{0xDD}, ps), 31*ps)
	b := Builder{PageSize: ps, MemorySize: pages * ps}
	b.Add(3, 3)
	b.Add(31, 1)
	ix := b.Index()
	if _, err := Apply(file, layer, ix); err != nil {
		t.Fatal(err)
	}
	n, err := ApplyMapped(img, layer, ix)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4*ps {
		t.Errorf("read %d bytes, want %d", n, 4*ps)
	}
	want := make([]byte, pages*ps)
	if _, err := file.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, want) {
		t.Fatal("ApplyMapped and Apply disagree")
	}
	if img[5*ps] != 0 || img[3*ps] != 0xEE || img[6*ps] != 7 {
		t.Fatalf("pages 3, 5, 6 = %#x %#x %#x", img[3*ps], img[5*ps], img[6*ps])
	}
	if _, err := ApplyMapped(img[:ps], layer, ix); err == nil {
		t.Error("applied an index to a mapping of another size")
	}
}
