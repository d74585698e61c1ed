package firecracker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/memlayer"
)

// dirtySet is what a restored machine has written since its restore.
// Firecracker's Diff snapshot holds the pages written since the restore
// or the previous snapshot (each resets the dirty bitmap), but a branch
// must be relative to the memory the machine was restored from: each
// diff is folded into an accumulator (a sparse file in the run dir,
// holding the latest bytes of every page written, and its bitmap), and
// layers and complete images are written from that, after the guest has
// resumed. Memory: one bit a page; disk: the pages written.
type dirtySet struct {
	mu       sync.Mutex
	path     string
	pageSize uint64
	memSize  uint64
	pages    []uint64 // bitmap
}

func newDirtySet(runDir string, memSize uint64) *dirtySet {
	ps := uint64(os.Getpagesize())
	n := (memSize/ps + 63) / 64
	return &dirtySet{path: filepath.Join(runDir, "dirty.acc"), pageSize: ps, memSize: memSize, pages: make([]uint64, n)}
}

// fold adds the pages of a Diff memory file (its data extents) to the
// set, copying their bytes into the accumulator.
func (ds *dirtySet) fold(diffPath string) error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	diff, err := os.Open(diffPath)
	if err != nil {
		return err
	}
	defer diff.Close()
	acc, err := os.OpenFile(ds.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer acc.Close()
	if err := acc.Truncate(int64(ds.memSize)); err != nil {
		return err
	}
	exts, err := dataExtents(diff, ds.memSize, ds.pageSize)
	if err != nil {
		return fmt.Errorf("reading the diff's pages: %w", err)
	}
	for _, e := range exts {
		if err := copyRange(acc, diff, int64(e.First*ds.pageSize), int64(e.Count*ds.pageSize)); err != nil {
			return err
		}
		for p := e.First; p < e.First+e.Count; p++ {
			ds.pages[p/64] |= 1 << (p % 64)
		}
	}
	return nil
}

// index lists every page written since the restore.
func (ds *dirtySet) index() *memlayer.Index {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	b := &memlayer.Builder{PageSize: uint32(ds.pageSize), MemorySize: ds.memSize}
	for p := uint64(0); p < ds.memSize/ds.pageSize; p++ {
		if ds.pages[p/64]&(1<<(p%64)) != 0 {
			b.Add(p, 1)
		}
	}
	return b.Index()
}

// writeOver copies the accumulated pages of ix over dst, at their offsets.
func (ds *dirtySet) writeOver(dst *os.File, ix *memlayer.Index) error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	acc, err := os.Open(ds.path)
	if err != nil {
		return err
	}
	defer acc.Close()
	for _, e := range ix.Extents {
		if err := copyRange(dst, acc, int64(e.First*ds.pageSize), int64(e.Count*ds.pageSize)); err != nil {
			return err
		}
	}
	return nil
}

// dataExtents lists the pages of f (of size bytes) that hold data, from
// its SEEK_DATA/SEEK_HOLE extents rounded out to whole pages.
func dataExtents(f *os.File, size, pageSize uint64) ([]memlayer.Extent, error) {
	var out []memlayer.Extent
	fd := int(f.Fd())
	var off int64
	for uint64(off) < size {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data after off
		}
		if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		if uint64(hole) > size {
			hole = int64(size)
		}
		first := uint64(data) / pageSize
		end := (uint64(hole) + pageSize - 1) / pageSize
		if n := len(out); n > 0 && out[n-1].First+out[n-1].Count >= first {
			if end > out[n-1].First {
				out[n-1].Count = max(out[n-1].Count, end-out[n-1].First)
			}
		} else if end > first {
			out = append(out, memlayer.Extent{First: first, Count: end - first})
		}
		off = hole
	}
	return out, nil
}

// copyRange copies n bytes at off from src to dst, at the same offset.
func copyRange(dst, src *os.File, off, n int64) error {
	w := io.NewOffsetWriter(dst, off)
	if _, err := io.Copy(w, io.NewSectionReader(src, off, n)); err != nil {
		return fmt.Errorf("copying memory pages: %w", err)
	}
	return nil
}

// completeImage writes dst as base with the pages of ix from the
// accumulator over it: the machine's memory as of the last diff. The
// base's holes stay holes.
func (ds *dirtySet) completeImage(dst, base string, ix *memlayer.Index) error {
	in, err := os.Open(base)
	if err != nil {
		return fmt.Errorf("the memory the machine was restored from: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(int64(ds.memSize)); err != nil {
		return err
	}
	exts, err := dataExtents(in, ds.memSize, ds.pageSize)
	if err != nil {
		return err
	}
	for _, e := range exts {
		if err := copyRange(out, in, int64(e.First*ds.pageSize), int64(e.Count*ds.pageSize)); err != nil {
			return err
		}
	}
	return ds.writeOver(out, ix)
}
