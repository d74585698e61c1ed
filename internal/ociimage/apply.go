package ociimage

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Limits bound what an image may unpack to, whatever its manifest and
// layers declare. Zero fields take the defaults.
type Limits struct {
	// MaxBytes bounds the uncompressed bytes of regular files over all
	// layers, and each layer blob's compressed size.
	MaxBytes int64
	// MaxEntries bounds the tar entries over all layers.
	MaxEntries int64
}

// DefaultLimits is what a Puller uses for zero Limits fields: room for a
// large toolchain image, not for a hostile one that would fill the disk.
var DefaultLimits = Limits{MaxBytes: 32 << 30, MaxEntries: 2_000_000}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultLimits.MaxEntries
	}
	return l
}

// Stats counts what Unpack wrote.
type Stats struct {
	Entries int64 // tar entries read, whiteouts included
	Bytes   int64 // bytes of regular files written
	// SkippedDevices counts character and block device nodes, which are
	// not created: the guest mounts devtmpfs on /dev.
	SkippedDevices int
}

// Whiteout names (OCI image spec, layer.md).
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// applier writes the entries of successive layers into one tree.
type applier struct {
	t      tree
	lim    Limits
	stats  *Stats
	owners bool // chown entries (needs root)
	// written holds the paths this layer created, and their parents, so
	// an opaque marker removes only what lower layers left.
	written map[string]bool
}

// apply unpacks one uncompressed layer tar from r.
func (a *applier) apply(ctx context.Context, r io.Reader) error {
	a.written = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("layer is not a valid tar archive (%v): %w", err, errdefs.ErrInvalidArgument)
		}
		if a.stats.Entries++; a.stats.Entries > a.lim.MaxEntries {
			return fmt.Errorf("image has more than %d files (the entry limit; raise Limits.MaxEntries for a larger image): %w",
				a.lim.MaxEntries, errdefs.ErrResourceExhausted)
		}
		if err := a.entry(tr, hdr); err != nil {
			return err
		}
	}
}

func (a *applier) entry(tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if err := checkName(hdr.Name); err != nil {
		return err
	}
	rel := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
	if rel == "" {
		return nil // the root itself: mkfs sets its owner and mode
	}
	base := path.Base(rel)
	if base == opaqueMarker {
		return a.opaque(path.Dir(rel))
	}
	if name, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
		return a.whiteout(path.Dir(rel), name)
	}
	dir, base, err := a.t.parent(rel)
	if err != nil {
		return err
	}
	target := filepath.Join(dir, base)
	for p := rel; p != "." && p != "/"; p = path.Dir(p) {
		a.written[p] = true
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if st, err := os.Lstat(target); err == nil && st.IsDir() {
			break
		}
		if err := replace(target); err != nil {
			return err
		}
		if err := os.Mkdir(target, 0o700); err != nil {
			return err
		}
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archives still use TypeRegA
		if err := a.file(tr, hdr, target); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if hdr.Linkname == "" || len(hdr.Linkname) > maxPathLen {
			return fmt.Errorf("layer symlink %q has an empty or too long target: %w", hdr.Name, errdefs.ErrInvalidArgument)
		}
		if err := replace(target); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
	case tar.TypeLink:
		if err := a.hardlink(hdr, target); err != nil {
			return err
		}
		return nil // a hard link shares its target's owner and mode
	case tar.TypeFifo:
		if err := replace(target); err != nil {
			return err
		}
		if err := unix.Mkfifo(target, 0o600); err != nil {
			return err
		}
	case tar.TypeChar, tar.TypeBlock:
		a.stats.SkippedDevices++
		return nil
	default:
		return fmt.Errorf("layer entry %q has tar type %q, which forkd does not unpack: %w", hdr.Name, hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
	return a.attrs(hdr, target)
}

// file writes a regular file, bounded by the byte limit before a byte is
// read: a header may declare any size.
func (a *applier) file(tr *tar.Reader, hdr *tar.Header, target string) error {
	if hdr.Size < 0 || hdr.Size > a.lim.MaxBytes-a.stats.Bytes {
		return fmt.Errorf("layer entry %q declares %d bytes; with the %d bytes before it that is above the limit of %d uncompressed bytes (Limits.MaxBytes): %w",
			hdr.Name, hdr.Size, a.stats.Bytes, a.lim.MaxBytes, errdefs.ErrResourceExhausted)
	}
	if err := replace(target); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("layer entry %q is truncated (declares %d bytes, the layer ends after %d): %w",
				hdr.Name, hdr.Size, n, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
	}
	a.stats.Bytes += n
	return nil
}

// hardlink links target to an earlier entry (of this or a lower layer),
// resolved inside the tree like any path.
func (a *applier) hardlink(hdr *tar.Header, target string) error {
	if err := checkName(hdr.Linkname); err != nil {
		return err
	}
	dir, err := a.t.resolve(path.Dir(path.Clean("/"+hdr.Linkname)), true)
	if err != nil {
		return err
	}
	src := filepath.Join(dir, path.Base(path.Clean("/"+hdr.Linkname)))
	st, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("layer hard link %q -> %q: the target is not in the image: %w", hdr.Name, hdr.Linkname, errdefs.ErrInvalidArgument)
	}
	if st.IsDir() {
		return fmt.Errorf("layer hard link %q -> %q: the target is a directory: %w", hdr.Name, hdr.Linkname, errdefs.ErrInvalidArgument)
	}
	if src == target {
		return nil
	}
	if err := replace(target); err != nil {
		return err
	}
	// link(2) does not follow a symlink at src: the link names the same
	// symlink inode, never what it points to.
	return os.Link(src, target)
}

// attrs applies ownership, mode, extended attributes and mtime.
func (a *applier) attrs(hdr *tar.Header, target string) error {
	if a.owners {
		if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		for k, v := range hdr.PAXRecords {
			if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if err := unix.Lsetxattr(target, name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
					return fmt.Errorf("layer entry %q: xattr %s: %w", hdr.Name, name, err)
				}
			}
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		mode := uint32(hdr.Mode) & 0o7777
		if !a.owners && hdr.Typeflag == tar.TypeDir {
			mode |= 0o700 // unprivileged: keep the directory writable for later entries
		}
		// After chown, which clears set-user-ID bits.
		if err := syscall.Chmod(target, mode); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOTSUP) {
		return err
	}
	return nil
}

// whiteout removes name from dir, left by a lower layer.
func (a *applier) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("layer whiteout %q names nothing: %w", path.Join(dir, whiteoutPrefix+name), errdefs.ErrInvalidArgument)
	}
	host, err := a.t.resolve(dir, true)
	if err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(host, name)) // does not follow a symlink named name
}

// opaque empties dir of what lower layers put there.
func (a *applier) opaque(dir string) error {
	host, err := a.t.resolve(dir, true)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(host)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if a.written[path.Join(dir, e.Name())] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(host, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// replace removes whatever is at target (a lower layer's file, link or
// directory), so that the entry takes its place.
func replace(target string) error {
	st, err := os.Lstat(target)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		return os.RemoveAll(target)
	}
	return os.Remove(target)
}
