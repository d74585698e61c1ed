package recipe

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// ReadContext reads the files that steps' Copy sources name from dir, the
// build context on the client's host: a file, or every file under a
// directory. Symlinks and special files are refused (a build context is
// copied as files), as is anything beyond MaxContextFiles and
// MaxContextBytes.
func ReadContext(dir string, steps []Step) (map[string]ContextFile, error) {
	out := map[string]ContextFile{}
	var total int64
	add := func(rel, host string, fi fs.FileInfo) error {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("build context: %s is a %s, not a regular file or directory (copy what it points to): %w", host, fi.Mode().Type(), errdefs.ErrInvalidArgument)
		}
		if _, ok := out[rel]; ok {
			return nil
		}
		if total += fi.Size(); total > MaxContextBytes || len(out) >= MaxContextFiles {
			return fmt.Errorf("build context: the files COPY names are over %d bytes or %d files: %w", MaxContextBytes, MaxContextFiles, errdefs.ErrResourceExhausted)
		}
		data, err := os.ReadFile(host)
		if err != nil {
			return fmt.Errorf("build context: %w", err)
		}
		out[rel] = ContextFile{Mode: fi.Mode().Perm(), Data: data}
		return nil
	}
	for _, s := range steps {
		if s.Kind != StepCopy {
			continue
		}
		for _, src := range s.Src {
			rel, err := ContextPath(src)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.Origin, err)
			}
			root := filepath.Join(dir, filepath.FromSlash(rel))
			fi, err := os.Lstat(root)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is not in the build context %s: %w", s.Origin, src, dir, errdefs.ErrNotFound)
			}
			if !fi.IsDir() {
				if err := add(rel, root, fi); err != nil {
					return nil, err
				}
				continue
			}
			err = filepath.Walk(root, func(p string, fi fs.FileInfo, err error) error {
				if err != nil || fi.IsDir() {
					return err
				}
				r, err := filepath.Rel(dir, p)
				if err != nil {
					return err
				}
				return add(filepath.ToSlash(r), p, fi)
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.Origin, err)
			}
		}
	}
	for p := range out {
		if strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("build context: %s is outside it: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}
