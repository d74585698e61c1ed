package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestBranch snapshots a running sandbox in each mode; grandchildren see
// its files, processes and Python variables as of the branch instant, the
// source keeps running, and later changes in the source do not leak.
func TestBranch(t *testing.T) {
	e := newEngine(t, 0)
	snap := newTemplate(t, e, "py-min")
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	src := sbs[0]
	a := agentOf(t, e, src.ID)
	run(t, a, "sh", "-c", "(sleep 1000 &)")
	for _, mode := range []string{sandbox.BranchDiff, sandbox.BranchFull} {
		t.Run(mode, func(t *testing.T) {
			run(t, a, "sh", "-c", "echo before > /root/state")
			if _, err := a.RunCode(ctx, agentapi.RunCodeRequest{Code: "branch_var = 'before'"}); err != nil {
				t.Fatal(err)
			}
			tag := "it-branch-" + mode + "-" + snapshot.NewID()
			res, err := e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: tag, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.RemoveSnapshot(context.Background(), tag) })
			t.Logf("%s branch: paused %s, %d bytes, %s in all", mode, res.Paused, res.BytesWritten, res.Duration)
			if res.Snapshot.Branch == nil || res.Snapshot.Branch.SandboxID != src.ID {
				t.Fatalf("manifest: %+v", res.Snapshot.Branch)
			}
			// The source runs on and changes after the branch.
			run(t, a, "sh", "-c", "echo after > /root/state")
			if _, err := a.RunCode(ctx, agentapi.RunCodeRequest{Code: "branch_var = 'after'"}); err != nil {
				t.Fatal(err)
			}
			kids, err := e.Fork(ctx, tag, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range kids {
				ka := agentOf(t, e, k.ID)
				if got := run(t, ka, "cat", "/root/state"); got != "before" {
					t.Errorf("grandchild file: %q, want before", got)
				}
				// (py-min has no ps: read the command lines.)
				if cmds := run(t, ka, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); !strings.Contains(cmds, "sleep 1000") {
					t.Errorf("grandchild lost the running process:\n%s", cmds)
				}
				r, err := ka.RunCode(ctx, agentapi.RunCodeRequest{Code: "branch_var"})
				if err != nil || r.Result["text/plain"] != "'before'" {
					t.Errorf("grandchild Python: %+v %v", r, err)
				}
			}
			run(t, agentOf(t, e, kids[0].ID), "sh", "-c", "echo kid0 > /root/state")
			if got := run(t, agentOf(t, e, kids[1].ID), "cat", "/root/state"); got != "before" {
				t.Errorf("grandchildren not independent: %q", got)
			}
			e.Kill(ctx, []string{kids[0].ID, kids[1].ID})
		})
	}
	// Live branches need the memory image on tmpfs (userfaultfd
	// write-protect) and QEMU allowed to create a userfaultfd; snapshots live
	// on disk and QEMU runs unprivileged, so the engine says so and leaves no tag.
	liveTag := "it-branch-live-" + snapshot.NewID()
	if _, err := e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: liveTag, Mode: sandbox.BranchLive}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "diff") {
		t.Errorf("live branch: %v, want a failed precondition pointing to diff", err)
	}
	if _, err := e.Store().Get(liveTag); !errdefs.IsNotFound(err) {
		t.Errorf("failed live branch left a tag: %v", err)
	}
	if run(t, a, "echo", "alive") != "alive" {
		t.Fatal("source not running after a failed branch")
	}
	if err := snap.Verify(); err != nil {
		t.Fatalf("template changed: %v", err)
	}
	// Bad input: an existing tag, a dead sandbox, an unknown mode.
	if _, err := e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: snap.Tag}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("branch onto an existing tag: %v", err)
	}
	if _, err := e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: "it-x", Mode: "quick"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown mode: %v", err)
	}
	e.Kill(ctx, []string{src.ID})
	if _, err := e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: "it-y"}); !errdefs.IsNotFound(err) {
		t.Errorf("branch of a killed sandbox: %v", err)
	}
}

// TestBranchAfterItsBaseIsRemoved: the snapshot a sandbox was forked from
// is removed (its directory renamed away and deleted while the clone maps
// its memory). A diff branch, a layer on it, is refused with the way out;
// a full branch still captures the sandbox, and its grandchildren fork.
func TestBranchAfterItsBaseIsRemoved(t *testing.T) {
	e := newEngine(t, 0)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	src := sbs[0]
	t.Cleanup(func() { e.Kill(context.Background(), []string{src.ID}) })
	run(t, agentOf(t, e, src.ID), "sh", "-c", "echo orphaned > /root/state")
	if _, err := e.RemoveSnapshotWith(ctx, snap.Tag, sandbox.RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: "it-orphan-diff-" + snapshot.NewID()})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "--mode full") {
		t.Fatalf("diff branch of a sandbox whose snapshot was removed: %v", err)
	}
	tag := "it-orphan-full-" + snapshot.NewID()
	res, err := e.Branch(ctx, src.ID, sandbox.BranchOptions{Tag: tag, Mode: sandbox.BranchFull})
	if err != nil {
		t.Fatalf("full branch of a sandbox whose snapshot was removed: %v", err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), tag) })
	if res.Snapshot.Parent != nil || res.Snapshot.Image.Digest != snap.Image.Digest || res.Snapshot.MemoryMiB != snap.MemoryMiB {
		t.Errorf("manifest: parent %+v, image %s, %d MiB; want no parent and the base's image and shape", res.Snapshot.Parent, res.Snapshot.Image.Digest, res.Snapshot.MemoryMiB)
	}
	kids, err := e.Fork(ctx, tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Kill(ctx, []string{kids[0].ID})
	if got := run(t, agentOf(t, e, kids[0].ID), "cat", "/root/state"); got != "orphaned" {
		t.Errorf("grandchild file: %q, want orphaned", got)
	}
}
