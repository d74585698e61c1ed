package fsutil

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestLockFileWaitsAndCancels(t *testing.T) {
	p := filepath.Join(t.TempDir(), "locks", "x.lock")
	unlock, err := LockFile(context.Background(), p, "a test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := LockFile(ctx, p, "a test"); !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "a test holds it") {
		t.Errorf("second lock while held = %v, want deadline exceeded naming the holder", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := LockFile(ctx, p, "a test"); !errors.Is(err, errdefs.ErrCanceled) {
		t.Errorf("second lock, canceled = %v", err)
	}
	unlock()
	unlock2, err := LockFile(context.Background(), p, "a test")
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

// TestSharedAndTryLock: shared holders coexist and keep TryLockFile out;
// once they are gone it gets the lock, and then a shared one waits.
func TestSharedAndTryLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	un1, err := LockFileShared(context.Background(), p, "a reader")
	if err != nil {
		t.Fatal(err)
	}
	un2, err := LockFileShared(context.Background(), p, "a reader")
	if err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
	if _, ok, err := TryLockFile(p); ok || err != nil {
		t.Fatalf("TryLockFile while shared holders have it = %v, %v; want false, nil", ok, err)
	}
	un1()
	if _, ok, _ := TryLockFile(p); ok {
		t.Fatal("TryLockFile got the lock while one shared holder is left")
	}
	un2()
	unlock, ok, err := TryLockFile(p)
	if !ok || err != nil {
		t.Fatalf("TryLockFile with no holder = %v, %v", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := LockFileShared(ctx, p, "a pruner"); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("shared lock under an exclusive one = %v, want deadline exceeded", err)
	}
	unlock()
	un3, err := LockFileShared(context.Background(), p, "a reader")
	if err != nil {
		t.Fatal(err)
	}
	un3()
}
