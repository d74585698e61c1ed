package logfollow

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil"
)

func appendTo(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until the followed output is want.
func waitFor(t *testing.T, out *testutil.SyncBuffer, want string) {
	t.Helper()
	testutil.WaitFor(t, "followed output "+strconv.Quote(want), func() bool { return out.String() == want })
}

func start(t *testing.T, path string, opts Options) (*testutil.SyncBuffer, func()) {
	t.Helper()
	out := &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts.Interval = 10 * time.Millisecond
	go func() { done <- Follow(ctx, path, out, opts) }()
	return out, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Follow: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("Follow did not return after its context was cancelled")
		}
	}
}

func TestFollowGrowsTruncatesRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "forkd.log")
	appendTo(t, path, "old line one\nold line two\n")
	// From the last line only, as `forkd daemon logs -f` starts near the end.
	out, stop := start(t, path, Options{From: -int64(len("old line two\n"))})
	defer stop()
	waitFor(t, out, "old line two\n")

	appendTo(t, path, "grew 1\n")
	appendTo(t, path, "grew 2\n")
	want := "old line two\ngrew 1\ngrew 2\n"
	waitFor(t, out, want)

	// copytruncate: the file starts over and the new lines are read. (A
	// truncation is seen by the size falling below what was read, so the
	// new text is shorter than the old: as for tail -F, a file that
	// outgrows its old size between two looks is not seen truncated.)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, "truncated\n")
	want += "truncated\n"
	waitFor(t, out, want)
	appendTo(t, path, strings.Repeat("after truncate\n", 4))
	want += strings.Repeat("after truncate\n", 4)
	waitFor(t, out, want)

	// rename rotation: the old file's tail, then the new file.
	appendTo(t, path, "last of old\n")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, "first of new\n")
	want += "last of old\nfirst of new\n"
	waitFor(t, out, want)
}

func TestFollowWaitsForFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "later.log")
	out, stop := start(t, path, Options{From: -100})
	defer stop()
	appendTo(t, path, "hello\n")
	waitFor(t, out, "hello\n")
}
