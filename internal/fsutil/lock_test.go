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
