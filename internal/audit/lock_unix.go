//go:build unix

package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// lockDir takes an exclusive flock on dir/audit.lock so that only one
// process appends to (or repairs) a log. The returned func releases it.
func lockDir(dir string) (func(), error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log lock: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("audit log %s is in use by another process (lock %s): %w", dir, path, errdefs.ErrUnavailable)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
