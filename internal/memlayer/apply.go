package memlayer

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Apply puts the pages of a layer over dst: for every extent of ix, the
// bytes at the same offsets in layer (a sparse file whose holes read as
// zeros). A page of zeros becomes a hole in dst, so an image assembled
// from layers stays as sparse as the memory it holds. It returns the bytes
// of data written.
func Apply(dst, layer *os.File, ix *Index) (int64, error) {
	if err := ix.Validate(); err != nil {
		return 0, err
	}
	ps := int64(ix.PageSize)
	buf := make([]byte, 1<<20)
	var written int64
	for _, e := range ix.Extents {
		off, end := int64(e.First)*ps, int64(e.First+e.Count)*ps
		for off < end {
			n := min(int64(len(buf)), end-off)
			if _, err := layer.ReadAt(buf[:n], off); err != nil {
				return written, fmt.Errorf("memlayer: read layer at %#x: %w", off, err)
			}
			// Runs of data pages are written together, runs of zero
			// pages punched together.
			for i := int64(0); i < n; {
				zero := fsutil.IsZero(buf[i : i+ps])
				j := i + ps
				for j < n && fsutil.IsZero(buf[j:j+ps]) == zero {
					j += ps
				}
				if zero {
					if err := punch(dst, off+i, j-i); err != nil {
						return written, err
					}
				} else {
					if _, err := dst.WriteAt(buf[i:j], off+i); err != nil {
						return written, fmt.Errorf("memlayer: write at %#x: %w", off+i, err)
					}
					written += j - i
				}
				i = j
			}
			off += n
		}
	}
	return written, nil
}

// ApplyMapped is Apply for a destination that is a writable mapping of the
// whole image (a file on hugetlbfs, which has no write(2)): each extent of
// the layer is read straight into place, zero pages included. It returns
// the bytes read.
func ApplyMapped(dst []byte, layer *os.File, ix *Index) (int64, error) {
	if err := ix.Validate(); err != nil {
		return 0, err
	}
	if uint64(len(dst)) != ix.MemorySize {
		return 0, fmt.Errorf("memlayer: index for %d bytes of memory, mapping of %d", ix.MemorySize, len(dst))
	}
	ps := uint64(ix.PageSize)
	var read int64
	for _, e := range ix.Extents {
		off, end := e.First*ps, (e.First+e.Count)*ps
		n, err := layer.ReadAt(dst[off:end], int64(off))
		read += int64(n)
		if err != nil {
			return read, fmt.Errorf("memlayer: read layer at %#x: %w", off, err)
		}
	}
	return read, nil
}

// punch makes n bytes at off read as zeros, as a hole where the file
// system can.
func punch(f *os.File, off, n int64) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil {
		return nil
	}
	zeros := make([]byte, min(n, 1<<20))
	for done := int64(0); done < n; {
		k := min(int64(len(zeros)), n-done)
		if _, err := f.WriteAt(zeros[:k], off+done); err != nil {
			return fmt.Errorf("memlayer: zero at %#x: %w", off+done, err)
		}
		done += k
	}
	return nil
}
