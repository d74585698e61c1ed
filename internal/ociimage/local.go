package ociimage

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Layers made on this host (image build steps) are stored in the same
// cache as pulled ones, by the digest of their content: uncompressed tars,
// whose digest is also their diff ID.

// LayerWriter receives a layer's tar and stores it in the cache under its
// digest when committed. It refuses to grow past its limit.
type LayerWriter struct {
	c     blobCache
	f     *os.File
	h     hash.Hash
	n     int64
	limit int64
}

// NewLayer starts a layer of at most limit bytes in the cache. Hold the
// cache (Hold) until an image lists the layer, or a prune may remove it.
func (c Cache) NewLayer(limit int64) (*LayerWriter, error) {
	dir := filepath.Join(c.Dir, "sha256")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf("%s%d-", partialPrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	return &LayerWriter{c: blobCache{c.Dir}, f: f, h: sha256.New(), limit: limit}, nil
}

// Write appends to the layer.
func (w *LayerWriter) Write(p []byte) (int, error) {
	if w.n+int64(len(p)) > w.limit {
		return 0, fmt.Errorf("the layer is larger than the limit of %d bytes: %w", w.limit, errdefs.ErrResourceExhausted)
	}
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	return n, err
}

// Commit stores the layer and returns its digest ("sha256:<hex>") and size.
func (w *LayerWriter) Commit() (digest string, size int64, err error) {
	defer w.Abort()
	d := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(w.h.Sum(nil))}
	if err := w.f.Chmod(0o444); err != nil {
		return "", 0, err
	}
	if err := w.f.Sync(); err != nil {
		return "", 0, err
	}
	if err := w.f.Close(); err != nil {
		return "", 0, err
	}
	if err := os.Rename(w.f.Name(), w.c.path(d)); err != nil {
		return "", 0, err
	}
	return d.String(), w.n, fsutil.SyncDir(filepath.Dir(w.c.path(d)))
}

// Abort drops an uncommitted layer; after Commit it does nothing.
func (w *LayerWriter) Abort() {
	w.f.Close()
	os.Remove(w.f.Name()) // gone after a successful rename
}

// Has reports whether the layer of digest d is cached.
func (c Cache) Has(d string) bool {
	p, err := c.path(d)
	if err != nil {
		return false
	}
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// ApplyLayers applies cached layers (by digest, bottom first) over dir, a
// tree Unpack made, with the same rules and limits as an image's layers:
// whiteouts, opaque directories, paths kept inside the tree. Hold the
// cache while it runs.
func (c Cache) ApplyLayers(ctx context.Context, dir string, digests []string, lim Limits) (Stats, error) {
	var st Stats
	a := &applier{t: tree{dir: dir}, lim: lim.withDefaults(), stats: &st, owners: os.Geteuid() == 0}
	for i, d := range digests {
		p, err := c.path(d)
		if err != nil {
			return st, err
		}
		if err := applyFile(ctx, a, p); err != nil {
			return st, fmt.Errorf("build layer %d/%d %s: %w", i+1, len(digests), d, err)
		}
	}
	return st, nil
}

func applyFile(ctx context.Context, a *applier, p string) error {
	f, err := os.Open(p)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("not in the layer cache (removed by a prune?); build again: %w", errdefs.ErrNotFound)
		}
		return err
	}
	defer f.Close()
	r, closeFn, err := decompress(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return err
	}
	defer closeFn()
	return a.apply(ctx, r)
}

// MkdirAll creates the directory at the image path p (absolute) in dir,
// a tree being assembled, resolving symlinks inside the tree as layers
// do; an existing directory is left as it is.
func MkdirAll(dir, p string) error {
	t := tree{dir: dir}
	host, err := t.resolve(p, true)
	if err != nil {
		return err
	}
	if st, err := os.Stat(host); err == nil && st.IsDir() {
		return nil
	}
	// Every existing component of host is a real directory (resolve
	// followed the symlinks), so MkdirAll cannot be led outside.
	return os.MkdirAll(host, 0o755)
}
