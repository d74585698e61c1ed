// Package cpio writes "newc" (SVR4, no CRC) cpio archives, the format the
// Linux kernel unpacks as an initramfs.
//
// It is deliberately tiny: only what an initramfs needs (directories, regular
// files, symlinks and device nodes), every entry owned by root, with fixed
// timestamps so the same input yields the same bytes. Device nodes are
// written into the archive directly, so building an initramfs with
// /dev/console needs no mknod and no root.
package cpio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// File type bits of the mode field (from <sys/stat.h>).
const (
	TypeDir     = 0o040000
	TypeRegular = 0o100000
	TypeSymlink = 0o120000
	TypeChar    = 0o020000
	TypeBlock   = 0o060000
)

const (
	magic   = "070701"
	trailer = "TRAILER!!!"
	// maxFileSize is what the 8-hex-digit size field can hold.
	maxFileSize = 1<<32 - 1
)

// Header is one archive entry.
type Header struct {
	Name  string // path without a leading "/", e.g. "dev/console"
	Mode  uint32 // type bits | permission bits
	UID   uint32
	GID   uint32
	Size  int64  // data length (regular files, symlink target length)
	Mtime int64  // seconds since the epoch; 0 keeps archives reproducible
	Major uint32 // device number for TypeChar/TypeBlock
	Minor uint32
}

// Writer writes an archive. Close writes the trailer; it does not close the
// underlying writer.
type Writer struct {
	w       *bufio.Writer
	off     int64 // bytes written so far, for 4-byte alignment
	ino     uint32
	pending int64             // data bytes still owed for the current entry
	pad     int64             // alignment owed after that data
	names   map[string]uint32 // entry name -> type bits
	err     error
}

// NewWriter starts an archive on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 256*1024), names: map[string]uint32{}}
}

// WriteHeader starts an entry; for a regular file, Size bytes of data must
// follow through Write.
func (cw *Writer) WriteHeader(h Header) error {
	if cw.err != nil {
		return cw.err
	}
	if err := cw.finishEntry(); err != nil {
		return err
	}
	name := strings.TrimPrefix(h.Name, "/")
	if name == "" || name == trailer || strings.Contains(name, "\x00") {
		return cw.fail(fmt.Errorf("cpio: bad name %q", h.Name))
	}
	if _, dup := cw.names[name]; dup {
		return cw.fail(fmt.Errorf("cpio: duplicate entry %q", name))
	}
	// The kernel's unpacker creates no missing parents: a file in a
	// directory the archive has not created yet is silently dropped.
	if i := strings.LastIndexByte(name, '/'); i > 0 {
		if cw.names[name[:i]] != TypeDir {
			return cw.fail(fmt.Errorf("cpio: %s: parent directory %s must be added first", name, name[:i]))
		}
	}
	if h.Size < 0 || h.Size > maxFileSize {
		return cw.fail(fmt.Errorf("cpio: %s: size %d out of range", name, h.Size))
	}
	if h.Mode&0o170000 != TypeRegular && h.Mode&0o170000 != TypeSymlink && h.Size != 0 {
		return cw.fail(fmt.Errorf("cpio: %s: only files and symlinks have data", name))
	}
	cw.names[name] = h.Mode & 0o170000
	cw.ino++
	nlink := uint32(1)
	if h.Mode&0o170000 == TypeDir {
		nlink = 2
	}
	if err := cw.header(name, h, cw.ino, nlink); err != nil {
		return err
	}
	cw.pending = h.Size
	cw.pad = pad4(h.Size)
	return nil
}

// header writes the fixed 110-byte header and the padded name.
func (cw *Writer) header(name string, h Header, ino, nlink uint32) error {
	var rmaj, rmin uint32
	if t := h.Mode & 0o170000; t == TypeChar || t == TypeBlock {
		rmaj, rmin = h.Major, h.Minor
	}
	s := fmt.Sprintf("%s%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		magic, ino, h.Mode, h.UID, h.GID, nlink, uint32(h.Mtime), uint32(h.Size),
		0, 0, rmaj, rmin, len(name)+1, 0)
	s += name + "\x00"
	s += strings.Repeat("\x00", int(pad4(int64(len(s)))))
	return cw.raw([]byte(s))
}

// Write writes data of the current regular file or symlink.
func (cw *Writer) Write(p []byte) (int, error) {
	if cw.err != nil {
		return 0, cw.err
	}
	if int64(len(p)) > cw.pending {
		return 0, cw.fail(errors.New("cpio: write beyond the entry's size"))
	}
	if err := cw.raw(p); err != nil {
		return 0, err
	}
	cw.pending -= int64(len(p))
	return len(p), nil
}

func (cw *Writer) finishEntry() error {
	if cw.pending != 0 {
		return cw.fail(fmt.Errorf("cpio: entry is %d bytes short", cw.pending))
	}
	if cw.pad > 0 {
		if err := cw.raw(make([]byte, cw.pad)); err != nil {
			return err
		}
		cw.pad = 0
	}
	return nil
}

// Dir adds a directory.
func (cw *Writer) Dir(name string, perm uint32) error {
	return cw.WriteHeader(Header{Name: name, Mode: TypeDir | perm&0o7777})
}

// File adds a regular file with its data.
func (cw *Writer) File(name string, perm uint32, data []byte) error {
	if err := cw.WriteHeader(Header{Name: name, Mode: TypeRegular | perm&0o7777, Size: int64(len(data))}); err != nil {
		return err
	}
	_, err := cw.Write(data)
	return err
}

// FileFrom adds a regular file of size bytes read from r.
func (cw *Writer) FileFrom(name string, perm uint32, size int64, r io.Reader) error {
	if err := cw.WriteHeader(Header{Name: name, Mode: TypeRegular | perm&0o7777, Size: size}); err != nil {
		return err
	}
	n, err := io.Copy(cw, io.LimitReader(r, size))
	if err != nil {
		return err
	}
	if n != size {
		return cw.fail(fmt.Errorf("cpio: %s: read %d of %d bytes", name, n, size))
	}
	return nil
}

// Symlink adds a symbolic link to target.
func (cw *Writer) Symlink(name, target string) error {
	if err := cw.WriteHeader(Header{Name: name, Mode: TypeSymlink | 0o777, Size: int64(len(target))}); err != nil {
		return err
	}
	_, err := cw.Write([]byte(target))
	return err
}

// CharDev adds a character device node (e.g. dev/console, 5, 1).
func (cw *Writer) CharDev(name string, perm, major, minor uint32) error {
	return cw.WriteHeader(Header{Name: name, Mode: TypeChar | perm&0o7777, Major: major, Minor: minor})
}

// Close writes the trailer entry and flushes. The kernel wants no more than
// that; the archive is padded to 512 bytes like cpio(1) does so that tools
// which read in blocks are happy too.
func (cw *Writer) Close() error {
	if cw.err != nil {
		return cw.err
	}
	if err := cw.finishEntry(); err != nil {
		return err
	}
	if err := cw.header(trailer, Header{}, 0, 1); err != nil {
		return err
	}
	if rem := cw.off % 512; rem != 0 {
		if err := cw.raw(make([]byte, 512-rem)); err != nil {
			return err
		}
	}
	if err := cw.w.Flush(); err != nil {
		return cw.fail(err)
	}
	cw.err = errors.New("cpio: writer closed")
	return nil
}

func (cw *Writer) raw(p []byte) error {
	n, err := cw.w.Write(p)
	cw.off += int64(n)
	if err != nil {
		return cw.fail(err)
	}
	return nil
}

func (cw *Writer) fail(err error) error {
	if cw.err == nil {
		cw.err = err
	}
	return err
}

func pad4(n int64) int64 { return (4 - n%4) % 4 }
