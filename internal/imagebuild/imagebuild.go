// Package imagebuild assembles forkd's container images (the node
// daemon's and the Kubernetes controller's, packaging/images.sh) without a
// container runtime or a Dockerfile: an optional root filesystem tarball
// (mmdebstrap's) as one layer, files from this machine as another, and the
// image config. The result is written as a docker-archive tarball, which
// `docker load`, `kind load image-archive`, `ctr images import` and
// `skopeo copy docker-archive:...` all take. The same inputs give the same
// digest (entries sorted, owners root, times fixed to Spec.Created), so a
// release can be rebuilt and compared.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// File is one file copied into the image.
type File struct {
	// Src is the file on this machine (a regular file).
	Src string
	// Dst is its absolute path in the image.
	Dst string
	// Mode is its permission bits in the image; 0 keeps Src's.
	Mode os.FileMode
}

// Spec is what an image is made of.
type Spec struct {
	// RootFS is a root filesystem tarball laid down first (optional: an
	// image of static binaries needs none).
	RootFS string
	// Files are laid over it, each directory above them created 0755.
	Files []File
	// Entrypoint, Cmd, Env ("K=V"), User, WorkingDir and Labels are the
	// image config's.
	Entrypoint, Cmd, Env []string
	User, WorkingDir     string
	Labels               map[string]string
	// Created is the image's creation time and every file's mtime in the
	// files layer (packaging/images.sh: SOURCE_DATE_EPOCH).
	Created time.Time
}

// Build assembles the image: linux/amd64, the RootFS layer if any, then
// the files layer if any.
func Build(s Spec) (v1.Image, error) {
	var layers []v1.Layer
	if s.RootFS != "" {
		if fi, err := os.Stat(s.RootFS); err != nil || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("image root filesystem %s: want a tarball (mmdebstrap's output): %v", s.RootFS, errOrKind(err, fi))
		}
		l, err := tarball.LayerFromFile(s.RootFS)
		if err != nil {
			return nil, fmt.Errorf("image root filesystem %s: %w", s.RootFS, err)
		}
		layers = append(layers, l)
	}
	if len(s.Files) > 0 {
		b, err := filesTar(s.Files, s.Created)
		if err != nil {
			return nil, err
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			return nil, fmt.Errorf("image files layer: %w", err)
		}
		layers = append(layers, l)
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("image: no root filesystem and no files: give at least one")
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("image layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: s.Created.UTC()}
	cf.Config = v1.Config{
		Entrypoint: s.Entrypoint, Cmd: s.Cmd, Env: s.Env,
		User: s.User, WorkingDir: s.WorkingDir, Labels: s.Labels,
	}
	cf.History = nil
	for range layers {
		cf.History = append(cf.History, v1.History{Created: cf.Created, CreatedBy: "forkd packaging/mkimage"})
	}
	return mutate.ConfigFile(img, cf)
}

func errOrKind(err error, fi os.FileInfo) any {
	if err != nil {
		return err
	}
	return "not a regular file (" + fi.Mode().Type().String() + ")"
}

// filesTar is the files layer: every file and the directories above it,
// sorted, owned by root, with mtime created.
func filesTar(files []File, created time.Time) ([]byte, error) {
	hdrs := map[string]*tar.Header{} // by name in the tar
	srcs := map[string]string{}
	dirs := map[string]bool{}
	for _, f := range files {
		dst, err := cleanDst(f.Dst)
		if err != nil {
			return nil, err
		}
		if _, dup := hdrs[dst]; dup {
			return nil, fmt.Errorf("image file %s: given twice: give each path once", f.Dst)
		}
		fi, err := os.Stat(f.Src)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Dst, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("image file %s: source %s is not a regular file", f.Dst, f.Src)
		}
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = fi.Mode().Perm()
		}
		hdrs[dst] = &tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: int64(mode), Size: fi.Size(), ModTime: created, Format: tar.FormatPAX}
		srcs[dst] = f.Src
		for d := path.Dir(dst); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if _, clash := hdrs[d]; clash {
			return nil, fmt.Errorf("image file /%s: also a directory above another file", d)
		}
		hdrs[d+"/"] = &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: created, Format: tar.FormatPAX}
	}
	names := make([]string, 0, len(hdrs))
	for n := range hdrs {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := tw.WriteHeader(hdrs[n]); err != nil {
			return nil, err
		}
		if src, ok := srcs[n]; ok {
			if err := copyFile(tw, src, hdrs[n].Size); err != nil {
				return nil, fmt.Errorf("image file /%s: %w", n, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// cleanDst checks an image path and returns it relative to / (tar's form).
func cleanDst(dst string) (string, error) {
	if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" {
		return "", fmt.Errorf("image file %q: want an absolute, clean path to a file, such as /usr/bin/forkd", dst)
	}
	return strings.TrimPrefix(dst, "/"), nil
}

// copyFile copies exactly size bytes of src: a file that changed size
// since it was looked at fails rather than writing a corrupt or cut tar.
func copyFile(w io.Writer, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s shrank from %d to %d bytes while being copied: copy it again once it is written", src, size, n)
	}
	if k, _ := f.Read(make([]byte, 1)); k > 0 {
		return fmt.Errorf("%s grew past %d bytes while being copied: copy it again once it is written", src, size)
	}
	return nil
}

// WriteArchive writes img as a docker-archive tarball at path, tagged with
// tags (at least one, e.g. ghcr.io/forkd-dev/forkd:1.2.3). It is staged
// next to path and renamed into place once complete and synced.
func WriteArchive(img v1.Image, dst string, tags ...string) error {
	if len(tags) == 0 {
		return fmt.Errorf("image archive %s: no tag: give one, such as ghcr.io/forkd-dev/forkd:1.2.3", dst)
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		ref, err := name.NewTag(t, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("image tag %q: %w (want REGISTRY/REPOSITORY:TAG)", t, err)
		}
		refs[ref] = img
	}
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tarball.MultiRefWrite(refs, tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("image archive %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	return fsutil.SyncDir(dir)
}
