package fsutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// LockFile takes an exclusive flock on path (created if needed), waiting
// until ctx ends; what waits says what it waits for (held, in the error).
// The lock dies with the process, so a crashed holder never blocks the
// next one. Lock files are left in place: deleting one while another
// process waits on it would let two holders in.
func LockFile(ctx context.Context, path, held string) (unlock func(), err error) {
	return lockFile(ctx, path, held, syscall.LOCK_EX)
}

// LockFileShared takes a shared flock on path, as LockFile does: any
// number of shared holders at once, none while an exclusive one holds it.
func LockFileShared(ctx context.Context, path, held string) (unlock func(), err error) {
	return lockFile(ctx, path, held, syscall.LOCK_SH)
}

// TryLockFile takes an exclusive flock on path without waiting: ok is
// false (and err nil) while another holder, shared or exclusive, has it.
func TryLockFile(path string) (unlock func(), ok bool, err error) {
	f, err := openLock(path)
	if err != nil {
		return nil, false, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return unlocker(f), true, nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			f.Close()
			return nil, false, nil
		}
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
}

func openLock(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

func unlocker(f *os.File) func() {
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}

func lockFile(ctx context.Context, path, held string, how int) (unlock func(), err error) {
	f, err := openLock(path)
	if err != nil {
		return nil, err
	}
	delay := 5 * time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return unlocker(f), nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			class := errdefs.ErrCanceled
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				class = errdefs.ErrDeadlineExceeded
			}
			return nil, fmt.Errorf("waiting for lock %s (%s holds it): %v: %w", path, held, ctx.Err(), class)
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}
