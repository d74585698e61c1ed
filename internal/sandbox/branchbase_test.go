package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestBranchWhenItsBaseGoes: the snapshot a sandbox was forked from is
// removed while a diff branch of it is being written. The branch fails
// (its layer would have no parent) and leaves no tag, where it used to
// report success and leave a tag that could never fork. Later diff
// branches of that sandbox are refused with what to do instead; a full
// branch, which needs no parent, still works.
func TestBranchWhenItsBaseGoes(t *testing.T) {
	gate := make(chan struct{})
	e, _ := newFakeEngine(t, &fakeDriver{snapshotGate: gate}, 0)
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := sbs[0].ID

	branchErr := make(chan error, 1)
	go func() {
		_, err := e.Branch(ctx, id, BranchOptions{Tag: "layer", Mode: BranchDiff})
		branchErr <- err
	}()
	// Staged: past the checks of its base, writing its layer (held at the gate).
	waitFor(t, func() bool {
		staged, _ := filepath.Glob(filepath.Join(e.Store().Root(), ".staging-layer-*"))
		return len(staged) == 1
	})
	if removed, err := e.RemoveSnapshotWith(ctx, "base", RemoveOptions{}); err != nil || len(removed) != 1 {
		t.Fatalf("remove base while a branch of its child is written: %v %v", removed, err)
	}
	close(gate)
	err = <-branchErr
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `parent "base" was removed while it was written`) || !strings.Contains(err.Error(), "--mode full") {
		t.Fatalf("diff branch whose base went while it was written: %v", err)
	}
	if _, err := e.Store().Get("layer"); !errdefs.IsNotFound(err) {
		t.Fatalf("the failed branch left its tag: %v", err)
	}

	_, err = e.Branch(ctx, id, BranchOptions{Tag: "layer", Mode: BranchDiff})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "--mode full") {
		t.Fatalf("diff branch of a sandbox whose base is gone: %v", err)
	}
	res, err := e.Branch(ctx, id, BranchOptions{Tag: "flat", Mode: BranchFull})
	if err != nil {
		t.Fatalf("full branch of a sandbox whose base is gone: %v", err)
	}
	m := res.Snapshot.Manifest
	if m.Parent != nil || m.Depth != 0 || m.MemoryMiB != 64 || m.VMM.Kind != "fake" || m.Branch == nil || m.Branch.FromTag != "base" {
		t.Fatalf("full branch manifest: %+v", m)
	}
	if _, err := e.ForkWith(ctx, ForkOptions{Tag: "flat", Count: 1}); err != nil {
		t.Fatalf("fork from the full branch: %v", err)
	}
}

// TestRemovalWaitsForTheChainsLock: a removal lists the snapshot's
// dependents and removes it under the chains lock, so a layer committing
// on it (holding the lock) is either seen as a dependent or refused.
func TestRemovalWaitsForTheChainsLock(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	unlock, err := e.Store().LockChains(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := e.RemoveSnapshotWith(ctx, "base", RemoveOptions{}); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("removal while the chains lock is held: %v", err)
	}
	unlock()
	if _, err := e.RemoveSnapshotWith(context.Background(), "base", RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestBaseManifestSurvivesTheRecord: a sandbox's copy of its base
// manifest goes through its state record, so a full branch after a
// daemon restart does not need the base either.
func TestBaseManifestSurvivesTheRecord(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	sbs, err := e.ForkWith(context.Background(), ForkOptions{Tag: "base", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	base, err := e.Store().Get("base")
	if err != nil {
		t.Fatal(err)
	}
	got := baseManifest(e.record(sbs[0]))
	if got == nil || got.ID != base.ID || got.MemoryMiB != base.MemoryMiB || got.Files[snapshot.MemoryFile] != base.Files[snapshot.MemoryFile] {
		t.Fatalf("base manifest from the record: %+v, want %+v", got, base.Manifest)
	}
	rec := e.record(sbs[0])
	rec.BaseManifest = nil // a record from before the field
	if baseManifest(rec) != nil {
		t.Fatal("a record without a base manifest gave one")
	}
}
