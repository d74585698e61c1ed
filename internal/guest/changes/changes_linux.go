// Package changes writes what a guest changed in its root file system as
// an OCI layer: the overlay's upper directory (a tmpfs the agent keeps a
// descriptor of, see boot.Result.Upper) as a tar stream, with overlayfs's
// whiteouts converted to OCI's. A build step (internal/image) applies the
// layer on the host to make the next step's root file system.
//
// Overlayfs marks a deleted lower file with a character device 0/0 of the
// same name, and a directory that replaced a lower one (rm -r then mkdir)
// with the xattr trusted.overlay.opaque=y. In the layer these become an
// empty ".wh.NAME" file and a ".wh..wh..opq" entry in the directory.
// Hard links within the upper directory stay hard links; other device
// nodes and sockets are left out (the guest has devtmpfs on /dev);
// extended attributes other than overlayfs's own are kept.
package changes

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Whiteout names (OCI image spec, layer.md).
const (
	WhiteoutPrefix = ".wh."
	OpaqueMarker   = ".wh..wh..opq"
)

const overlayXattrPrefix = "trusted.overlay."

// Write writes the tree at upper as a tar stream to w, skipping the
// paths (relative, slash-separated) skip reports, and returns the bytes
// of file content written. It fails on the first entry it cannot read;
// what it wrote by then is not a complete archive.
func Write(w io.Writer, upper string, skip func(rel string) bool) (int64, error) {
	x := &writer{tw: tar.NewWriter(w), root: upper, skip: skip, links: map[[2]uint64]string{}}
	if err := x.dir(""); err != nil {
		return x.bytes, err
	}
	return x.bytes, x.tw.Close()
}

type writer struct {
	tw    *tar.Writer
	root  string
	skip  func(string) bool
	links map[[2]uint64]string // first path of each multiply linked inode
	bytes int64
}

// dir writes the entries of the directory rel ("" is the root) in name
// order, depth first.
func (x *writer) dir(rel string) error {
	ents, err := os.ReadDir(filepath.Join(x.root, rel))
	if err != nil {
		return err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	sort.Strings(names)
	for _, n := range names {
		p := n
		if rel != "" {
			p = rel + "/" + n
		}
		if x.skip != nil && x.skip(p) {
			continue
		}
		if err := x.entry(p); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func (x *writer) entry(rel string) error {
	host := filepath.Join(x.root, rel)
	fi, err := os.Lstat(host)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
		dir, base := filepath.Split(rel)
		return x.tw.WriteHeader(&tar.Header{Name: dir + WhiteoutPrefix + base, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime()})
	}
	if fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket|fs.ModeIrregular) != 0 {
		return nil
	}
	var link string
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(host); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = rel
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	opaque, err := x.xattrs(host, hdr)
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() && st.Nlink > 1 {
		k := [2]uint64{st.Dev, st.Ino}
		if first, ok := x.links[k]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return x.tw.WriteHeader(hdr)
		}
		x.links[k] = rel
	}
	if err := x.tw.WriteHeader(hdr); err != nil {
		return err
	}
	switch {
	case fi.Mode().IsRegular():
		return x.file(host, hdr.Size)
	case fi.IsDir():
		if opaque {
			if err := x.tw.WriteHeader(&tar.Header{Name: rel + "/" + OpaqueMarker, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: fi.ModTime()}); err != nil {
				return err
			}
		}
		return x.dir(rel)
	}
	return nil
}

// file copies exactly size bytes (a file that changes while it is read
// would otherwise break the archive).
func (x *writer) file(host string, size int64) error {
	f, err := os.Open(host)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(x.tw, io.LimitReader(f, size))
	x.bytes += n
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("shrank from %d to %d bytes while it was read", size, n)
	}
	return nil
}

// xattrs copies the entry's extended attributes into hdr, except
// overlayfs's own, and reports an opaque directory.
func (x *writer) xattrs(host string, hdr *tar.Header) (opaque bool, err error) {
	names, err := listXattrs(host)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		v, err := getXattr(host, n)
		if err != nil {
			return false, err
		}
		if strings.HasPrefix(n, overlayXattrPrefix) {
			if n == overlayXattrPrefix+"opaque" && string(v) == "y" {
				opaque = true
			}
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+n] = string(v)
	}
	return opaque, nil
}

func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 1<<20 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 1<<20 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
