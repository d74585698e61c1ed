package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestBranchNoWait: a background branch's tag is "writing" (not forkable,
// not reusable) until it commits; a failed one is "failed" with the reason
// until it is removed, and leaves no snapshot.
func TestBranchNoWait(t *testing.T) {
	gate := make(chan struct{})
	d := &fakeDriver{snapshotGate: gate}
	e, _ := newFakeEngine(t, d, 0)
	ctx := context.Background()
	sbs, err := e.Fork(ctx, "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	src := sbs[0].ID

	p, err := e.BranchAsync(context.Background(), src, BranchOptions{Tag: "later", Mode: BranchFull}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != PendingWriting || p.Tag != "later" {
		t.Fatalf("pending %+v", p)
	}
	if _, err := e.Fork(ctx, "later", 1); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "being written") {
		t.Errorf("fork of a tag being written: %v", err)
	}
	if _, err := e.Branch(ctx, src, BranchOptions{Tag: "later", Mode: BranchFull}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("branch onto a tag being written: %v", err)
	}
	if _, err := e.RemoveSnapshotWith(ctx, "later", RemoveOptions{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove a tag being written: %v", err)
	}
	close(gate)
	waitFor(t, func() bool { _, ok := e.Pending("later"); return !ok })
	if _, err := e.Store().Get("later"); err != nil {
		t.Fatalf("committed: %v", err)
	}
	kids, err := e.Fork(ctx, "later", 1)
	if err != nil {
		t.Fatalf("fork once ready: %v", err)
	}
	e.Kill(ctx, []string{kids[0].ID})

	// A failing background branch.
	d.snapshotErr = errors.New("injected: disk full")
	if _, err := e.BranchAsync(context.Background(), src, BranchOptions{Tag: "broken", Mode: BranchFull}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { p, _ := e.Pending("broken"); return p.State == PendingFailed })
	p, _ = e.Pending("broken")
	if p.Err == nil || !strings.Contains(p.Err.Error(), "disk full") {
		t.Errorf("failure reason: %v", p.Err)
	}
	if _, err := e.Store().Get("broken"); !errdefs.IsNotFound(err) {
		t.Errorf("a failed branch left a snapshot: %v", err)
	}
	if _, err := e.Fork(ctx, "broken", 1); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("fork of a failed tag: %v", err)
	}
	if removed, err := e.RemoveSnapshotWith(ctx, "broken", RemoveOptions{}); err != nil || len(removed) != 1 {
		t.Fatalf("remove the failed tag: %v %v", removed, err)
	}
	if _, ok := e.Pending("broken"); ok {
		t.Error("failed tag still pending after removal")
	}
	// Bad input is refused up front, not in the background.
	if _, err := e.BranchAsync(context.Background(), src, BranchOptions{Tag: "Bad Tag"}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad tag: %v", err)
	}
	if _, err := e.BranchAsync(context.Background(), "sb-nope", BranchOptions{Tag: "x1"}, nil); !errdefs.IsNotFound(err) {
		t.Errorf("unknown sandbox: %v", err)
	}
	if _, ok := e.Pending("x1"); ok {
		t.Error("a refused branch left a pending tag")
	}
}
