package uffd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// LayerFiles names one diff layer on disk: its memory file (a sparse
// image of the whole memory, holding data at the indexed pages) and its
// page index (package memlayer).
type LayerFiles struct {
	Memory string
	Index  string
}

// Chain is a snapshot's memory as a base image and diff layers over it.
// A page is read from the newest layer whose index holds it, else from the
// base; the base's bytes past its end read as zeros. It is safe for
// concurrent use (reads are pread(2)).
type Chain struct {
	size   uint64
	base   *os.File
	layers []chainLayer // newest first
}

type chainLayer struct {
	f   *os.File
	ext []memlayer.Extent
	ps  uint64 // the index's page size
}

// OpenChain opens a base memory file and its layers, newest first. Every
// layer's index must be for memory of the base's size, and its memory file
// must hold every indexed page.
func OpenChain(base string, layers ...LayerFiles) (_ *Chain, err error) {
	c := &Chain{}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.base, err = os.Open(base); err != nil {
		return nil, fmt.Errorf("uffd: base memory: %w", err)
	}
	st, err := c.base.Stat()
	if err != nil {
		return nil, err
	}
	c.size = uint64(st.Size())
	for _, l := range layers {
		ix, err := memlayer.ReadFile(l.Index)
		if err != nil {
			return nil, fmt.Errorf("uffd: layer %s: %w", l.Memory, err)
		}
		if ix.MemorySize != c.size {
			return nil, fmt.Errorf("uffd: layer index %s is for %d bytes of memory, the base %s has %d: %w", l.Index, ix.MemorySize, base, c.size, errdefs.ErrFailedPrecondition)
		}
		f, err := os.Open(l.Memory)
		if err != nil {
			return nil, fmt.Errorf("uffd: layer memory: %w", err)
		}
		c.layers = append(c.layers, chainLayer{f: f, ext: ix.Extents, ps: uint64(ix.PageSize)})
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if n := len(ix.Extents); n > 0 {
			last := ix.Extents[n-1]
			if need := (last.First + last.Count) * uint64(ix.PageSize); uint64(st.Size()) < need {
				return nil, fmt.Errorf("uffd: layer memory %s has %d bytes, its index %s names pages up to byte %d: %w", l.Memory, st.Size(), l.Index, need, errdefs.ErrFailedPrecondition)
			}
		}
	}
	return c, nil
}

// OpenSnapshotChain opens the memory of a chain of snapshots as
// snapshot.Store resolves it: chain[0] the snapshot itself, each next one
// its parent, the last the root.
func OpenSnapshotChain(chain []*snapshot.Snapshot) (*Chain, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("uffd: empty snapshot chain: %w", errdefs.ErrInvalidArgument)
	}
	root := chain[len(chain)-1]
	var layers []LayerFiles
	for _, s := range chain[:len(chain)-1] {
		layers = append(layers, LayerFiles{Memory: s.Path(snapshot.MemoryFile), Index: s.Path(snapshot.LayerIndexFile)})
	}
	return OpenChain(root.Path(snapshot.MemoryFile), layers...)
}

// Size is the memory's size in bytes.
func (c *Chain) Size() uint64 { return c.size }

// Depth is the number of files a page may come from: 1 for a flat image.
func (c *Chain) Depth() int { return 1 + len(c.layers) }

// Close closes the files.
func (c *Chain) Close() error {
	var errs []error
	if c.base != nil {
		errs = append(errs, c.base.Close())
	}
	for _, l := range c.layers {
		errs = append(errs, l.f.Close())
	}
	return errors.Join(errs...)
}

// ReadAt fills buf with the memory at off: each run of pages from the
// newest layer holding it. It reports whether every byte is zero, so the
// caller can map the zero page instead.
func (c *Chain) ReadAt(buf []byte, off uint64) (zero bool, err error) {
	for done := uint64(0); done < uint64(len(buf)); {
		f, n := c.owner(off+done, uint64(len(buf))-done)
		if err := readFull(f, buf[done:done+n], off+done); err != nil {
			return false, err
		}
		done += n
	}
	return fsutil.IsZero(buf), nil
}

// run returns how many bytes from off (at most max) one file holds: the
// bytes that one pread fetches.
func (c *Chain) run(off, max uint64) uint64 {
	_, n := c.owner(off, max)
	return n
}

// owner returns the file that holds the memory at off and how many bytes
// from off (at most max) it holds without a newer layer taking over.
func (c *Chain) owner(off, max uint64) (*os.File, uint64) {
	limit := off + max
	for _, l := range c.layers {
		page := off / l.ps
		i := sort.Search(len(l.ext), func(i int) bool { return l.ext[i].First+l.ext[i].Count > page })
		if i == len(l.ext) {
			continue
		}
		e := l.ext[i]
		if e.First <= page {
			return l.f, min(limit, (e.First+e.Count)*l.ps) - off
		}
		// A newer layer's pages start at e.First: an older file owns at
		// most up to there.
		limit = min(limit, e.First*l.ps)
	}
	return c.base, limit - off
}

// readFull reads len(b) bytes at off; what lies past the file's end reads
// as zeros (a base image shorter than the memory, or sparse at its end).
func readFull(f *os.File, b []byte, off uint64) error {
	n, err := f.ReadAt(b, int64(off))
	if err == io.EOF {
		clear(b[n:])
		return nil
	}
	if err != nil {
		return fmt.Errorf("uffd: read %s at %#x: %w", f.Name(), off, err)
	}
	return nil
}
