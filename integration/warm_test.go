package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestWarmCommands: a recipe's warm commands run in the template before
// the snapshot, for any language: every child has the file one wrote and
// the process another left running. A warm command that fails fails the
// snapshot, naming it, its exit code and its output, and leaves no tag.
func TestWarmCommands(t *testing.T) {
	e := newEngine(t, 0)
	snap := newTemplate(t, e, "warm-exec")
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		a := agentOf(t, e, sb.ID)
		if got := run(t, a, "cat", "/root/warmed"); got != "warmed-42" {
			t.Errorf("%s: /root/warmed is %q, want warmed-42", sb.ID, got)
		}
		if got := run(t, a, "sh", "-c", "pidof sleep || true"); got == "" {
			t.Errorf("%s: the process a warm command left running is not in the child", sb.ID)
		}
	}

	tag := "it-warm-bad-" + snapshot.NewID()
	_, err = e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{
		Tag: tag, RecipeTOML: "name = 'warm-bad'\nbase = 'busybox'\nwarm = ['true', 'echo oops >&2; exit 3']\n",
	})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "warm[1]") || !strings.Contains(err.Error(), "exited with 3") || !strings.Contains(err.Error(), "oops") {
		t.Fatalf("a failing warm command: %v; want invalid argument naming warm[1], its exit 3 and its output", err)
	}
	if _, err := e.Store().Get(tag); !errdefs.IsNotFound(err) {
		t.Errorf("the failed snapshot left tag %s: %v", tag, err)
	}
}
