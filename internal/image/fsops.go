package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Everything the builder publishes follows one discipline: build in a
// hidden staging directory next to the destination, fsync the files and the
// directories, then rename into place and fsync the parent. A crash leaves at
// most a ".staging-<pid>-*" directory, which the next build removes once its
// process is gone; it never leaves a half-written image under a final name.

const stagingPrefix = ".staging-"

// newStaging creates a staging directory in parent, named after this
// process so that a later build can tell abandoned ones from live ones.
func newStaging(parent string) (string, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	removeStaleStaging(parent)
	return os.MkdirTemp(parent, fmt.Sprintf("%s%d-", stagingPrefix, os.Getpid()))
}

// removeStaleStaging removes staging directories of processes that no
// longer exist (a crashed or killed build).
func removeStaleStaging(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), stagingPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			removeTree(filepath.Join(parent, e.Name()))
		}
	}
}

// removeTree deletes dir after detaching anything mounted below it. A
// Debian build that was killed may leave /proc, /sys or /dev mounted inside
// its tree; os.RemoveAll would otherwise walk into the host's /dev.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mounts, err := mountsUnder(abs)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("refusing to delete %s: %s is still mounted (%v): %w", dir, m, err, errdefs.ErrInternal)
		}
	}
	return os.RemoveAll(abs)
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, nil // no procfs: nothing we could unmount anyway
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// syncPath fsyncs one file or directory.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

// syncTree fsyncs every regular file and directory under root, directories
// after their contents, so that a rename of root publishes durable data.
func syncTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			dirs = append(dirs, p)
		case d.Type().IsRegular():
			return syncPath(p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncPath(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// publish renames a complete, synced staging directory to dst and makes
// the rename durable. dst must not exist (callers hold the lock for it).
func publish(staged, dst string) error {
	if err := syncTree(staged); err != nil {
		return err
	}
	if err := os.Rename(staged, dst); err != nil {
		return fmt.Errorf("publish %s: %w", dst, err)
	}
	return syncPath(filepath.Dir(dst))
}

// writeFileSync writes a small file and fsyncs it.
func writeFileSync(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeFileAtomic replaces path with data: temporary file, fsync, rename,
// fsync of the directory.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	if err := writeFileSync(tmp, data, perm); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncPath(filepath.Dir(path))
}

// fileDigest returns a file's size and SHA-256.
func fileDigest(path string) (FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileInfo{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return FileInfo{}, err
	}
	return FileInfo{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// linkOrCopy places src at dst, sharing the inode when both are on one file
// system. Cached artefacts are never modified in place (a refresh publishes a
// new directory), so an image may share them safely.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return copySparse(src, dst)
}

// copySparse copies a file, leaving holes where the source has zero blocks,
// so a mostly empty ext4 image does not become a big non-sparse file.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, rerr := io.ReadFull(in, buf)
		if n > 0 {
			chunk := buf[:n]
			for len(chunk) > 0 {
				b := min(4096, len(chunk))
				if !fsutil.IsZero(chunk[:b]) {
					if _, err := out.WriteAt(chunk[:b], off); err != nil {
						out.Close()
						return err
					}
				}
				off += int64(b)
				chunk = chunk[b:]
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			out.Close()
			return rerr
		}
	}
	if err := out.Truncate(st.Size()); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// LockImage takes the lock that builds and removals of the image digest
// hold (images/.locks/<digest>.lock under dataDir), for another writer of
// images/<digest> such as an archive import. It waits until ctx ends.
func LockImage(ctx context.Context, dataDir, digest string) (unlock func(), err error) {
	return lockFile(ctx, filepath.Join(imagesDir(dataDir), ".locks", digest+".lock"))
}

// lockFile takes an image-store lock (see fsutil.LockFile).
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	return fsutil.LockFile(ctx, path, "another build")
}
