package uffd

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/memlayer"
)

// fixture is a chain on disk and the flat memory it stands for.
type fixture struct {
	base   string
	layers []LayerFiles // newest first
	flat   []byte
}

const fixturePage = 4096

// writeChain writes a base image of pages pages (random data, with every
// fifth page and the last 8 pages holes) and depth-1
// layers over it, each taking every stride-th page from an offset of its
// own, so that layers overlap each other and the base.
func writeChain(t testing.TB, pages, depth int) *fixture {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(pages), uint64(depth)))
	fill := func(b []byte) {
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	size := int64(pages) * fixturePage
	fx := &fixture{base: filepath.Join(dir, "base"), flat: make([]byte, size)}
	base, err := os.Create(fx.base)
	if err != nil {
		t.Fatal(err)
	}
	if err := base.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for p := 0; p < pages-8; p++ {
		if p%5 == 0 {
			continue
		}
		pg := fx.flat[p*fixturePage : (p+1)*fixturePage]
		fill(pg)
		if _, err := base.WriteAt(pg, int64(p)*fixturePage); err != nil {
			t.Fatal(err)
		}
	}
	base.Close()
	// Layers are written oldest first; the chain lists them newest first.
	for l := 1; l < depth; l++ {
		mem := filepath.Join(dir, "layer"+string(rune('0'+l)))
		f, err := os.Create(mem)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		b := memlayer.Builder{PageSize: fixturePage, MemorySize: uint64(size)}
		for p := l; p < pages; p += 2 + l {
			pg := fx.flat[p*fixturePage : (p+1)*fixturePage]
			if p%7 == 0 {
				clear(pg) // a page the layer zeroed
			} else {
				fill(pg)
			}
			if _, err := f.WriteAt(pg, int64(p)*fixturePage); err != nil {
				t.Fatal(err)
			}
			b.Add(uint64(p), 1)
		}
		f.Close()
		ix := filepath.Join(dir, "index"+string(rune('0'+l)))
		if err := memlayer.WriteFile(ix, b.Index()); err != nil {
			t.Fatal(err)
		}
		fx.layers = append([]LayerFiles{{Memory: mem, Index: ix}}, fx.layers...)
	}
	return fx
}

func (fx *fixture) open(t testing.TB) *Chain {
	t.Helper()
	c, err := OpenChain(fx.base, fx.layers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestChainReadsNewestLayer(t *testing.T) {
	for _, depth := range []int{1, 2, 3} {
		fx := writeChain(t, 200, depth)
		c := fx.open(t)
		if c.Depth() != depth || c.Size() != uint64(len(fx.flat)) {
			t.Fatalf("depth %d size %d, want %d and %d", c.Depth(), c.Size(), depth, len(fx.flat))
		}
		// Single pages and runs that cross layer boundaries.
		for _, run := range []int{1, 3, 16} {
			buf := make([]byte, run*fixturePage)
			for p := 0; p+run <= 200; p += run {
				zero, err := c.ReadAt(buf, uint64(p)*fixturePage)
				if err != nil {
					t.Fatal(err)
				}
				want := fx.flat[p*fixturePage : (p+run)*fixturePage]
				if !bytes.Equal(buf, want) {
					t.Fatalf("depth %d: %d pages at page %d differ from the flat image", depth, run, p)
				}
				if zero != bytes.Equal(want, make([]byte, len(want))) {
					t.Fatalf("depth %d: %d pages at page %d: zero = %v", depth, run, p, zero)
				}
			}
		}
	}
}

func TestOpenChainRefusesMismatchedLayer(t *testing.T) {
	fx := writeChain(t, 64, 2)
	other := writeChain(t, 32, 2)
	if _, err := OpenChain(fx.base, other.layers...); err == nil {
		t.Fatal("a layer indexed for another memory size was accepted")
	}
	short := fx.layers[0]
	if err := os.Truncate(short.Memory, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenChain(fx.base, short); err == nil {
		t.Fatal("a layer file shorter than its index was accepted")
	}
}

func TestWorkingSetRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ws")
	ws := &WorkingSet{PageSize: 4096, Offsets: []uint64{8192, 0, 4096 * 100}}
	if err := WriteWorkingSet(path, ws); err != nil {
		t.Fatal(err)
	}
	got, err := ReadWorkingSet(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.PageSize != ws.PageSize || !bytes.Equal(u64bytes(got.Offsets), u64bytes(ws.Offsets)) {
		t.Fatalf("read %+v, wrote %+v", got, ws)
	}
	b, _ := os.ReadFile(path)
	b[30] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadWorkingSet(path); err == nil {
		t.Fatal("a corrupted working set was read")
	}
	if err := WriteWorkingSet(path, &WorkingSet{PageSize: 4096, Offsets: []uint64{12}}); err == nil {
		t.Fatal("an unaligned offset was written")
	}
}

func u64bytes(v []uint64) []byte {
	var b []byte
	for _, x := range v {
		for i := range 8 {
			b = append(b, byte(x>>(8*i)))
		}
	}
	return b
}
