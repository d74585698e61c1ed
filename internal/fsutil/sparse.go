package fsutil

import (
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
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break // only a hole is left
			}
			return copied, fmt.Errorf("seek data: %w", err)
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return copied, fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, size)
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
					if err != nil {
						return copied, err
					}
					break
				}
				return copied, fmt.Errorf("copy_file_range: %w", err)
			}
			pos += int64(n)
			copied += int64(n)
		}
		off = hole
	}
	return copied, nil
}

// copyRange copies n bytes at off from src to dst with reads and writes.
func copyRange(dst, src *os.File, off, n int64) (int64, error) {
	buf := make([]byte, 1<<20)
	var done int64
	for done < n {
		k := min(int64(len(buf)), n-done)
		r, err := src.ReadAt(buf[:k], off+done)
		if r > 0 {
			if _, werr := dst.WriteAt(buf[:r], off+done); werr != nil {
				return done, werr
			}
			done += int64(r)
		}
		if err != nil {
			if err == io.EOF {
				return done, nil
			}
			return done, err
		}
	}
	return done, nil
}
