package memlayer

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	b := Builder{PageSize: 4096, MemorySize: 1 << 20}
	b.Add(10, 2)
	b.Add(12, 1) // adjacent: merged
	b.Add(3, 1)  // out of order
	b.Add(200, 56)
	b.Add(11, 1) // overlapping
	ix := b.Index()
	want := []Extent{{3, 1}, {10, 3}, {200, 56}}
	if !reflect.DeepEqual(ix.Extents, want) {
		t.Fatalf("extents %v, want %v", ix.Extents, want)
	}
	if ix.Pages() != 60 {
		t.Errorf("pages %d", ix.Pages())
	}
	for p, in := range map[uint64]bool{2: false, 3: true, 4: false, 10: true, 12: true, 13: false, 255: true, 256: false} {
		if ix.Contains(p) != in {
			t.Errorf("Contains(%d) = %v", p, !in)
		}
	}
	path := filepath.Join(t.TempDir(), "x.pages")
	if err := WriteFile(path, ix); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ix) {
		t.Fatalf("read %+v, wrote %+v", got, ix)
	}
	// Corruption is detected.
	data, _ := os.ReadFile(path)
	data[30] ^= 1
	os.WriteFile(path, data, 0o600)
	if _, err := ReadFile(path); !errors.Is(err, ErrCorrupt) {
		t.Errorf("corrupt file: %v", err)
	}
	// Extents outside the image are refused.
	bad := &Index{PageSize: 4096, MemorySize: 8192, Extents: []Extent{{1, 2}}}
	if _, err := bad.MarshalBinary(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("out of range: %v", err)
	}
	empty := (&Builder{PageSize: 4096, MemorySize: 4096}).Index()
	if b, err := empty.MarshalBinary(); err != nil || len(b) != headerSize+4 {
		t.Errorf("empty index: %d bytes, %v", len(b), err)
	}
}
