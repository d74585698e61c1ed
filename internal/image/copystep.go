package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// copyFile is one file a Copy step puts in the image.
type copyFile struct {
	dst  string // absolute path in the image
	file recipe.ContextFile
}

// copyInputs resolves a Copy step's sources in the build context: a file
// goes to Dst (into it when Dst ends in "/" or there are several
// sources), a directory's files keep their paths below it. inputs hashes
// the destinations, modes and contents: the step's key.
func copyInputs(s recipe.Step, ctxFiles map[string]recipe.ContextFile) ([]copyFile, string, error) {
	intoDir := strings.HasSuffix(s.Dst, "/") || len(s.Src) > 1
	var out []copyFile
	for _, src := range s.Src {
		src, err := recipe.ContextPath(src)
		if err != nil {
			return nil, "", err
		}
		if f, ok := ctxFiles[src]; ok {
			dst := s.Dst
			if intoDir {
				dst = path.Join(s.Dst, path.Base(src))
			}
			out = append(out, copyFile{dst: path.Clean(dst), file: f})
			continue
		}
		n := 0
		for p, f := range ctxFiles {
			rel, ok := strings.CutPrefix(p, src+"/")
			if src == "." {
				rel, ok = p, true
			}
			if ok {
				out = append(out, copyFile{dst: path.Join(s.Dst, rel), file: f})
				n++
			}
		}
		if n == 0 {
			return nil, "", fmt.Errorf("%q is not in the build context (%d files sent); check the path, relative to the context directory: %w",
				src, len(ctxFiles), errdefs.ErrNotFound)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dst < out[j].dst })
	h := sha256.New()
	for i, f := range out {
		if i > 0 && out[i-1].dst == f.dst {
			return nil, "", fmt.Errorf("two sources copy to %s: %w", f.dst, errdefs.ErrInvalidArgument)
		}
		sum := sha256.Sum256(f.file.Data)
		fmt.Fprintf(h, "%s\x00%o\x00%x\n", f.dst, f.file.Mode.Perm(), sum)
	}
	return out, hex.EncodeToString(h.Sum(nil)), nil
}

// writeCopyLayer writes the files as a layer: owned by root, with a
// fixed time, so the same files make the same layer.
func writeCopyLayer(w io.Writer, files []copyFile) error {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		hdr := &tar.Header{Name: strings.TrimPrefix(f.dst, "/"), Typeflag: tar.TypeReg, Mode: int64(f.file.Mode.Perm()),
			Size: int64(len(f.file.Data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(f.file.Data); err != nil {
			return err
		}
	}
	return tw.Close()
}
