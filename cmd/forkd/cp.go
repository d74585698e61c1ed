package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/progress"
)

// copyIn copies the local file src ("-": stdin) to id:path (a path
// ending in / takes src's name), counting its bytes on rep.
func copyIn(ctx context.Context, c *client.Client, rep *progress.Reporter, src, id, path string, mode uint32) (apiv1.FileInfo, error) {
	in := os.Stdin
	if src != "-" {
		f, err := os.Open(src)
		if err != nil {
			return apiv1.FileInfo{}, err
		}
		defer f.Close()
		in = f
	}
	if strings.HasSuffix(path, "/") {
		path += filepath.Base(src)
	}
	rep.Step("copying " + src + " to " + id + ":" + path)
	return c.WriteFile(ctx, id, path, mode, rep.Reader(in, regularSize(in)))
}

// copyOut copies id:path to the local file dst ("-": stdout; a directory
// takes the file's name), counting its bytes on rep. A file is written to
// a temporary name, synced and renamed, so an interrupted copy (or a
// crash) never leaves a truncated file under the name.
func copyOut(ctx context.Context, c *client.Client, rep *progress.Reporter, id, path, dst string) (apiv1.FileInfo, error) {
	// The size, for a total; a stat that fails leaves it unknown (the
	// read that follows reports the problem).
	total := int64(-1)
	if rep.Shown() {
		if fi, err := c.Stat(ctx, id, path); err == nil && !fi.IsDir && !fi.IsLink {
			total = fi.Size
		}
	}
	if dst == "-" {
		rep.Step("copying " + id + ":" + path + " to stdout")
		n, err := c.ReadFile(ctx, id, path, rep.Writer(os.Stdout, total))
		return apiv1.FileInfo{Size: n}, err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, filepath.Base(path))
	}
	rep.Step("copying " + id + ":" + path + " to " + dst)
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".forkd-*")
	if err != nil {
		return apiv1.FileInfo{}, err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	_, err = c.ReadFile(ctx, id, path, rep.Writer(tmp, total))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return apiv1.FileInfo{}, err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return apiv1.FileInfo{}, err
	}
	return localFileInfo(dst)
}
