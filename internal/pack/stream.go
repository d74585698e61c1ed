package pack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// finish checks the end of the archive: no entry after the last file, at
// most some zero padding after the tar trailer, and a complete zstd
// stream (whose checksum the decoder verifies).
func finish(st *stream, zr io.Reader) error {
	hdr, err := st.next("the end of the archive")
	if err == nil {
		return invalid("unlisted entry %q after the last file", hdr.Name)
	}
	if !errors.Is(err, io.EOF) {
		return err
	}
	n, err := io.Copy(zeroWriter{}, io.LimitReader(zr, maxTrailing+1))
	switch {
	case errors.Is(err, errNonZero):
		return invalid("data after the end of the tar stream")
	case err != nil:
		return readErr("the end of the archive", err)
	case n > maxTrailing:
		return invalid("over %d bytes of padding after the tar stream", maxTrailing)
	}
	return nil
}

// stream hands out tar entries, with one entry of look-ahead.
type stream struct {
	tr      *tar.Reader
	back    *tar.Header
	backErr error
	hasBack bool
}

// next returns the next entry, io.EOF at the end; want names the entry
// expected, for messages.
func (s *stream) next(want string) (*tar.Header, error) {
	if s.hasBack {
		s.hasBack = false
		return s.back, s.backErr
	}
	h, err := s.tr.Next()
	switch {
	case err == nil:
		return h, nil
	case errors.Is(err, io.EOF):
		return nil, io.EOF
	case errors.Is(err, tar.ErrInsecurePath):
		return nil, invalid("entry %q has an unsafe path", h.Name)
	}
	return nil, readErr(want, err)
}

// unread makes the next call to next return h and err again.
func (s *stream) unread(h *tar.Header, err error) {
	s.back, s.backErr, s.hasBack = h, err, true
}

// checkEntry allows only a plain regular file named want of size bytes.
func checkEntry(h *tar.Header, want string, size int64) error {
	if h.Name != want {
		return invalid("entry %q where %q was expected", h.Name, want)
	}
	if h.Typeflag != tar.TypeReg {
		return invalid("entry %q is %s, not a regular file", h.Name, typeName(h.Typeflag))
	}
	if h.Linkname != "" {
		return invalid("entry %q links to %q", h.Name, h.Linkname)
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return invalid("entry %q is a tar sparse file", h.Name)
		}
	}
	if h.Size != size {
		return invalid("entry %q holds %d bytes, the manifest %d", h.Name, h.Size, size)
	}
	return nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "a symbolic link"
	case tar.TypeLink:
		return "a hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "a device node"
	case tar.TypeDir:
		return "a directory"
	case tar.TypeFifo:
		return "a named pipe"
	case tar.TypeGNUSparse:
		return "a tar sparse file"
	}
	return fmt.Sprintf("of type %q", t)
}

// readErr classifies an error reading the archive.
func readErr(what string, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return invalid("archive is truncated: it ends inside %s", what)
	}
	if errors.Is(err, zstd.ErrMagicMismatch) {
		return invalid("not a forkd archive: not a zstd stream")
	}
	if errdefs.Code(err) != "internal" || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return invalid("reading %s: %v", what, err)
}

// limitedReader counts what it reads and fails past limit bytes.
type limitedReader struct {
	r        io.Reader
	n, limit int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n >= l.limit {
		return 0, invalid("archive is over %d bytes", l.limit)
	}
	p = p[:min(int64(len(p)), l.limit-l.n)]
	n, err := l.r.Read(p)
	l.n += int64(n)
	return n, err
}

var errNonZero = errors.New("non-zero byte")

// zeroWriter accepts only zero bytes.
type zeroWriter struct{}

func (zeroWriter) Write(p []byte) (int, error) {
	for rest := p; len(rest) > 0; {
		k := min(len(rest), len(zeros))
		if !bytes.Equal(rest[:k], zeros[:k]) {
			return 0, errNonZero
		}
		rest = rest[k:]
	}
	return len(p), nil
}
