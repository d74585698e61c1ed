package ociimage

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// maxSymlinkHops bounds how many symlinks one path may pass through, as
// the kernel's ELOOP limit does.
const maxSymlinkHops = 40

// maxPathLen bounds the paths and symlink targets a layer may name.
const maxPathLen = 4096

// tree is a directory being assembled from layers. Paths that layers name
// are resolved inside it one component at a time, as if the tree were the
// root of a chroot: an absolute symlink target starts at the tree's top,
// and a ".." that would climb above it is refused. No host path outside
// the tree is ever reached, whatever the layers' symlinks say.
type tree struct {
	dir string
}

// errEscape marks a path or symlink that leads outside the tree.
func errEscape(name, why string) error {
	return fmt.Errorf("layer entry %q %s; refusing a layer that writes outside the image root: %w",
		name, why, errdefs.ErrInvalidArgument)
}

// checkName rejects archive names that are empty, too long, or climb with
// "..". A leading "/" is allowed (some tools write absolute names).
func checkName(name string) error {
	if name == "" || len(name) > maxPathLen || strings.ContainsRune(name, 0) {
		return fmt.Errorf("layer entry name %.80q is empty, too long or has a NUL byte: %w", name, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return errEscape(name, "has a \"..\" component")
		}
	}
	return nil
}

// resolve returns the host path of rel, an archive path inside the tree,
// with every symlink among its components followed inside the tree. The
// last component is followed only when followLast is set. The returned
// path has no symlink in any component but (without followLast) the last;
// components that do not exist yet are kept as named.
func (t *tree) resolve(rel string, followLast bool) (string, error) {
	todo := splitPath(rel)
	var done []string
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", errEscape(rel, "resolves above the image root through a symlink")
			}
			done = done[:len(done)-1]
			continue
		}
		host := filepath.Join(t.dir, filepath.Join(done...), c)
		st, err := os.Lstat(host)
		if errors.Is(err, os.ErrNotExist) {
			done = append(done, c)
			continue
		}
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink == 0 || (len(todo) == 0 && !followLast) {
			done = append(done, c)
			continue
		}
		if hops++; hops > maxSymlinkHops {
			return "", fmt.Errorf("layer path %q passes through more than %d symlinks: %w", rel, maxSymlinkHops, errdefs.ErrInvalidArgument)
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = done[:0]
		}
		todo = append(splitPath(target), todo...)
	}
	return filepath.Join(t.dir, filepath.Join(done...)), nil
}

// parent resolves the directory that holds rel, creating it (and its
// parents, 0755) when missing, and returns it with rel's last component.
func (t *tree) parent(rel string) (dir, base string, err error) {
	dir, err = t.resolve(path.Dir(path.Clean("/"+rel)), true)
	if err != nil {
		return "", "", err
	}
	st, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Every existing component of dir is a real directory (resolve
		// followed the symlinks), so MkdirAll cannot be led outside.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", "", err
		}
	case err != nil:
		return "", "", err
	case !st.IsDir():
		return "", "", fmt.Errorf("layer entry %q: its parent is not a directory in the image: %w", rel, errdefs.ErrInvalidArgument)
	}
	return dir, path.Base(path.Clean("/" + rel)), nil
}

func splitPath(p string) []string {
	return strings.Split(strings.Trim(p, "/"), "/")
}
