package ociimage

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

const partialPrefix = ".partial-"

// blobCache keeps layer blobs by digest: dir/sha256/<hex>, read-only.
type blobCache struct {
	dir string
}

func (c blobCache) path(d v1.Hash) string {
	return filepath.Join(c.dir, d.Algorithm, d.Hex)
}

// has reports whether the blob d of size bytes is cached.
func (c blobCache) has(d v1.Hash, size int64) bool {
	st, err := os.Stat(c.path(d))
	return err == nil && st.Mode().IsRegular() && st.Size() == size
}

// put stores the blob read from r, which must be exactly size bytes with
// digest d; anything else leaves no file under d's name.
func (c blobCache) put(r io.Reader, d v1.Hash, size int64) (err error) {
	if d.Algorithm != "sha256" || len(d.Hex) != 64 {
		return fmt.Errorf("layer digest %s: only sha256 digests are supported: %w", d, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Dir(c.path(d))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	removeStalePartials(dir)
	f, err := os.CreateTemp(dir, fmt.Sprintf("%s%d-", partialPrefix, os.Getpid()))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	// One byte more than declared, to tell a longer blob from an exact one.
	n, rerr := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, size+1))
	if err := checkBlob(d, size, n, h); err != nil {
		return err // ours first: the reader's own check says it less clearly
	}
	if rerr != nil {
		return fmt.Errorf("download layer %s: %v: %w", d, rerr, errdefs.ErrUnavailable)
	}
	if err := f.Chmod(0o444); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// Concurrent pulls of one blob write identical files: the last rename
	// winning is harmless.
	if err := os.Rename(f.Name(), c.path(d)); err != nil {
		return err
	}
	return fsutil.SyncDir(dir)
}

func checkBlob(d v1.Hash, size, n int64, h hash.Hash) error {
	if n != size {
		return fmt.Errorf("layer %s: the registry sent %s bytes, the manifest declares %d (truncated or corrupt blob): %w",
			d, countOrMore(n, size), size, errdefs.ErrInvalidArgument)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Hex {
		return fmt.Errorf("layer %s: digest mismatch, the registry sent content with sha256:%s (corrupt blob): %w",
			d, got, errdefs.ErrInvalidArgument)
	}
	return nil
}

func countOrMore(n, size int64) string {
	if n > size {
		return fmt.Sprintf("more than %d", size)
	}
	return strconv.FormatInt(n, 10)
}

// removeStalePartials deletes partial downloads of processes that are gone.
func removeStalePartials(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), partialPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
