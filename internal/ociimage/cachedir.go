package ociimage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// The layer cache seen from outside a pull: what it holds (forkd system
// df) and removing the layers no image needs (forkd system prune).
//
// Pulls hold CacheDir/.lock shared from their first download to their
// last applied layer; Cache.Remove holds it exclusively, and only if it
// gets it at once. A build that is fetching or applying a layer therefore
// never loses it; one that resolved its image but has not started to fetch
// waits for the removal (milliseconds) and downloads what it took.

const cacheLockName = ".lock"

func lockCacheShared(ctx context.Context, dir string) (func(), error) {
	return fsutil.LockFileShared(ctx, filepath.Join(dir, cacheLockName), "a removal of unused layers")
}

// ErrCacheBusy is Remove's error while a pull uses the cache.
var ErrCacheBusy = fmt.Errorf("the OCI layer cache is in use by an image build pulling layers; retry when it ends (`forkd operation ls`): %w",
	errdefs.ErrFailedPrecondition)

// Hold holds the cache as a pull does (shared): Remove removes nothing
// until the returned release is called.
func (c Cache) Hold(ctx context.Context) (release func(), err error) {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	return lockCacheShared(ctx, c.Dir)
}

// Cache is the layer cache in Dir (a Puller's CacheDir).
type Cache struct {
	Dir string
}

// CachedLayer is one blob in the cache.
type CachedLayer struct {
	Digest string // "sha256:<hex>"
	// Bytes is the disk space it takes (allocated bytes).
	Bytes int64
}

// List returns the cached layers, by digest. A missing cache is empty.
// Partial downloads are not layers and are left out.
func (c Cache) List() ([]CachedLayer, error) {
	var out []CachedLayer
	algs, err := os.ReadDir(c.Dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, alg := range algs {
		if !alg.IsDir() || alg.Name()[0] == '.' {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(c.Dir, alg.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if !e.Type().IsRegular() || e.Name()[0] == '.' {
				continue
			}
			out = append(out, CachedLayer{
				Digest: alg.Name() + ":" + e.Name(),
				Bytes:  allocated(filepath.Join(c.Dir, alg.Name(), e.Name())),
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Digest < out[j].Digest })
	return out, nil
}

// Remove deletes the cached layers named by digest (ones not cached are
// skipped) and returns those it removed. While a pull uses the cache it
// removes nothing and fails with FailedPrecondition: a build is fetching
// or applying layers, perhaps these.
func (c Cache) Remove(digests []string) ([]CachedLayer, error) {
	if len(digests) == 0 {
		return nil, nil
	}
	unlock, ok, err := fsutil.TryLockFile(filepath.Join(c.Dir, cacheLockName))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrCacheBusy
	}
	defer unlock()
	var out []CachedLayer
	dirs := map[string]bool{}
	for _, d := range digests {
		p, err := c.path(d)
		if err != nil {
			return out, err
		}
		n := allocated(p)
		if err := os.Remove(p); err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return out, fmt.Errorf("remove cached layer %s: %w", d, err)
		}
		dirs[filepath.Dir(p)] = true
		out = append(out, CachedLayer{Digest: d, Bytes: n})
	}
	for dir := range dirs {
		removeStalePartials(dir)
		if err := fsutil.SyncDir(dir); err != nil {
			return out, err
		}
	}
	return out, nil
}

// path is where the layer of digest d ("sha256:<hex>") is cached.
func (c Cache) path(d string) (string, error) {
	h, err := parseDigest(d)
	if err != nil {
		return "", err
	}
	return blobCache{c.Dir}.path(h), nil
}

// allocated is the disk space a file takes (0 if it cannot be read).
func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// parseDigest reads "sha256:<64 hex digits>", the only form the cache
// stores (anything else could name a path outside it).
func parseDigest(d string) (v1.Hash, error) {
	h, err := v1.NewHash(d)
	if err != nil || h.Algorithm != "sha256" || len(h.Hex) != 64 || strings.Trim(h.Hex, "0123456789abcdef") != "" {
		return v1.Hash{}, fmt.Errorf("layer digest %q: want sha256:<64 lowercase hex digits>: %w", d, errdefs.ErrInvalidArgument)
	}
	return h, nil
}
