package fsutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopySparse makes dst (empty, open for writing) a copy of src of size
// bytes that keeps src's holes: a reflink where the file system has them
// (FICLONE), else only the data extents (SEEK_DATA/SEEK_HOLE) with
// copy_file_range. It returns the bytes copied (0 for a reflink).
func CopySparse(dst, src *os.File, size int64) (int64, error) {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		if err := dst.Truncate(size); err != nil {
			return 0, err
		}
		return 0, nil
	}
	if err := dst.Truncate(size); err != nil {
		return 0, err
	}
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	var copied int64
	err := DataExtents(src, size, func(data, hole int64) error {
		for pos := data; pos < hole; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(sfd, &roff, dfd, &woff, int(min(hole-pos, 1<<30)), 0)
			if err != nil || n == 0 {
				if err == nil {
					err = io.ErrUnexpectedEOF
				}
				if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
					k, err := copyRange(dst, src, pos, hole-pos)
					copied += k
					return err
				}
				return fmt.Errorf("copy_file_range: %w", err)
			}
			pos += int64(n)
			copied += int64(n)
		}
		return nil
	})
	return copied, err
}

// DataExtents calls fn for each run of data in the first size bytes of f
// ([data, hole), found with SEEK_DATA/SEEK_HOLE), in order; holes, which
// read as zeros, are skipped. It stops at fn's first error.
func DataExtents(f *os.File, size int64, fn func(data, hole int64) error) error {
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				return nil // only a hole is left
			}
			return fmt.Errorf("seek data: %w", err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, size)
		if err := fn(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// ReadSparseInto fills dst with the first len(dst) bytes of src, reading
// only its data extents: dst must already hold zeros where src has holes
// (a fresh mapping does). It returns the bytes read.
func ReadSparseInto(dst []byte, src *os.File) (int64, error) {
	var read int64
	err := DataExtents(src, int64(len(dst)), func(data, hole int64) error {
		n, err := src.ReadAt(dst[data:hole], data)
		read += int64(n)
		if err != nil {
			return fmt.Errorf("read at %#x: %w", data, err)
		}
		return nil
	})
	return read, err
}

// copyRange copies n bytes at off from src to dst with reads and writes.
// dst reads as zeros there already (CopySparse truncated it), so pages of
// zeros are not written: they stay holes, for sources that report all of
// their size as data (hugetlbfs, some network file systems).
func copyRange(dst, src *os.File, off, n int64) (int64, error) {
	const page = 4096
	buf := make([]byte, 1<<20)
	var done int64
	for done < n {
		k := min(int64(len(buf)), n-done)
		r, err := src.ReadAt(buf[:k], off+done)
		for i := 0; i < r; {
			j := min(i+page, r)
			zero := IsZero(buf[i:j])
			for j < r && IsZero(buf[j:min(j+page, r)]) == zero {
				j = min(j+page, r)
			}
			if !zero {
				if _, werr := dst.WriteAt(buf[i:j], off+done+int64(i)); werr != nil {
					return done, werr
				}
			}
			i = j
		}
		done += int64(r)
		if err != nil {
			if err == io.EOF {
				return done, nil
			}
			return done, err
		}
	}
	return done, nil
}

var zeroPage [4096]byte

// IsZero reports whether every byte of b is zero.
func IsZero(b []byte) bool {
	for len(b) >= len(zeroPage) {
		if !bytes.Equal(b[:len(zeroPage)], zeroPage[:]) {
			return false
		}
		b = b[len(zeroPage):]
	}
	return bytes.Equal(b, zeroPage[:len(b)])
}
