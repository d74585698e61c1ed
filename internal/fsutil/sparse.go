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
	return copySparse(dst, src, size, false)
}

// CopyCompact is CopySparse for a copy that stays: without a reflink, the
// data extents are read and written and their pages of zeros left as
// holes too (what copy_file_range would store when src has them
// allocated), at the cost of reading them through user space. It returns
// the bytes written (0 for a reflink).
func CopyCompact(dst, src *os.File, size int64) (int64, error) {
	return copySparse(dst, src, size, true)
}

func copySparse(dst, src *os.File, size int64, skipZeros bool) (int64, error) {
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
		if skipZeros {
			_, w, err := copyRange(dst, src, data, hole-data)
			copied += w
			return err
		}
		for pos := data; pos < hole; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(sfd, &roff, dfd, &woff, int(min(hole-pos, 1<<30)), 0)
			if err != nil || n == 0 {
				if err == nil {
					err = io.ErrUnexpectedEOF
				}
				if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
					k, _, err := copyRange(dst, src, pos, hole-pos)
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
// their size as data (hugetlbfs, some network file systems). It returns
// the bytes read and the bytes written.
func copyRange(dst, src *os.File, off, n int64) (read, written int64, err error) {
	const page = 4096
	buf := make([]byte, 1<<20)
	for read < n {
		k := min(int64(len(buf)), n-read)
		r, rerr := src.ReadAt(buf[:k], off+read)
		for i := 0; i < r; {
			j := min(i+page, r)
			zero := IsZero(buf[i:j])
			for j < r && IsZero(buf[j:min(j+page, r)]) == zero {
				j = min(j+page, r)
			}
			if !zero {
				if _, werr := dst.WriteAt(buf[i:j], off+read+int64(i)); werr != nil {
					return read, written, werr
				}
				written += int64(j - i)
			}
			i = j
		}
		read += int64(r)
		if rerr != nil {
			if rerr == io.EOF {
				return read, written, nil
			}
			return read, written, rerr
		}
	}
	return read, written, nil
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
