package pack

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/forkd-dev/forkd/internal/image"
)

// lockImage takes the lock image builds of digest take, so that an unpack
// never publishes an image while a build or removal of the same digest runs.
// imgRoot is DATA/images.
func lockImage(ctx context.Context, imgRoot, digest string) (unlock func(), err error) {
	return image.LockImage(ctx, filepath.Dir(imgRoot), digest)
}

// writeFileSync creates path with data and fsyncs it.
func writeFileSync(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
