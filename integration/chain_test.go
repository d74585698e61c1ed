package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestChain stacks three diff layers (each branch of a child forked from
// the layer before), forks from the head, compacts it, and checks that
// removal respects dependents and that a missing or replaced ancestor is a
// clear FailedPrecondition (409), never a broken guest.
func TestChain(t *testing.T) {
	e := newEngine(t, 1)
	base := newTemplate(t, e, "minimal")
	ctx := context.Background()
	id := snapshot.NewID()
	tags := []string{"it-chain-l1-" + id, "it-chain-l2-" + id, "it-chain-l3-" + id}
	t.Cleanup(func() {
		for i := len(tags) - 1; i >= 0; i-- {
			e.RemoveSnapshotWith(context.Background(), tags[i], sandbox.RemoveOptions{Force: true})
		}
	})

	from := base.Tag
	for i, tag := range tags {
		kids, err := e.Fork(ctx, from, 1)
		if err != nil {
			t.Fatalf("fork from %s: %v", from, err)
		}
		a := agentOf(t, e, kids[0].ID)
		// Each step writes its own file and ~8 MB of memory the guest keeps
		// (tmpfs), so every layer has dirty pages of its own.
		run(t, a, "sh", "-c", "echo "+tag+" > /root/step"+string(rune('1'+i))+
			" && dd if=/dev/urandom of=/tmp/fill"+string(rune('1'+i))+" bs=1M count=8 2>/dev/null")
		res, err := e.Branch(ctx, kids[0].ID, sandbox.BranchOptions{Tag: tag})
		if err != nil {
			t.Fatalf("branch %s: %v", tag, err)
		}
		e.Kill(ctx, []string{kids[0].ID})
		s := res.Snapshot
		if s.Parent == nil || s.Parent.Tag != from || s.Depth != i+1 {
			t.Fatalf("%s: parent %+v depth %d, want %s at depth %d", tag, s.Parent, s.Depth, from, i+1)
		}
		if _, err := os.Stat(s.Path(snapshot.LayerIndexFile)); err != nil {
			t.Fatalf("%s has no page index: %v", tag, err)
		}
		// A layer holds what the sandbox wrote, not the base again.
		phys := allocated(t, s.Path(snapshot.MemoryFile))
		baseData := allocated(t, base.Path(snapshot.MemoryFile))
		t.Logf("%s: paused %v, layer %d KiB on disk (base image %d KiB), branch wrote %d KiB",
			tag, res.Paused, phys>>10, baseData>>10, res.BytesWritten>>10)
		if phys >= baseData || phys == 0 {
			t.Errorf("%s: layer takes %d bytes on disk, base %d: want a fraction", tag, phys, baseData)
		}
		from = tag
	}

	// The head forks, twice (the second from the assembled cache), with
	// every step's files.
	head, err := e.Store().Get(tags[2])
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Store().Ancestors(head); strings.Join(got, ",") != tags[1]+","+tags[0]+","+base.Tag {
		t.Errorf("ancestors %v", got)
	}
	for round := 0; round < 2; round++ {
		kids, err := e.Fork(ctx, tags[2], 1)
		if err != nil {
			t.Fatalf("fork from the head: %v", err)
		}
		a := agentOf(t, e, kids[0].ID)
		if got := run(t, a, "cat", "/root/step1", "/root/step2", "/root/step3"); got != strings.Join(tags, "\n") {
			t.Errorf("head's files: %q", got)
		}
		if got := run(t, a, "sh", "-c", "ls /tmp/fill* | wc -l"); got != "3" {
			t.Errorf("head's memory: %s fill files", got)
		}
		e.Kill(ctx, []string{kids[0].ID})
	}

	l1, err := e.Store().Get(tags[0])
	if err != nil {
		t.Fatal(err)
	}
	l1Digest := l1.Digest()
	deps, err := e.Store().Dependents(base.Tag)
	if err != nil || strings.Join(deps, ",") != tags[2]+","+tags[1]+","+tags[0] {
		t.Fatalf("dependents of the base: %v %v (want deepest first)", deps, err)
	}
	// Removing the base is refused and names its layers.
	if _, err := e.RemoveSnapshotWith(ctx, base.Tag, sandbox.RemoveOptions{}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tags[0]) {
		t.Fatalf("remove a base with layers: %v", err)
	}

	// Compaction: a flat copy that forks alone.
	flatTag := "it-chain-flat-" + id
	flat, err := e.Compact(ctx, tags[2], flatTag)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), flatTag) })
	if flat.Parent != nil || flat.Depth != 0 || flat.CompactedFrom != tags[2] {
		t.Errorf("compacted: parent %+v depth %d from %q", flat.Parent, flat.Depth, flat.CompactedFrom)
	}

	// Force-remove the middle layer: the head refuses to fork, naming it;
	// the flat copy does not care.
	if _, err := e.RemoveSnapshotWith(ctx, tags[1], sandbox.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // not even from VMMs pooled while the chain was whole
		if _, err := e.Fork(ctx, tags[2], 1); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tags[1]) {
			t.Errorf("fork with a missing ancestor: %v", err)
		}
	}
	kids, err := e.Fork(ctx, flatTag, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, agentOf(t, e, kids[0].ID), "cat", "/root/step3"); got != tags[2] {
		t.Errorf("flat copy's file: %q", got)
	}
	// A different snapshot under the missing tag is not the ancestor.
	if _, err := e.Branch(ctx, kids[0].ID, sandbox.BranchOptions{Tag: tags[1], Mode: sandbox.BranchFull}); err != nil {
		t.Fatal(err)
	}
	e.Kill(ctx, []string{kids[0].ID})
	if _, err := e.Fork(ctx, tags[2], 1); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "replaced") {
		t.Errorf("fork with a replaced ancestor: %v", err)
	}

	// Cascade removes the base and what is left on it, and the assembled
	// images go with them.
	removed, err := e.RemoveSnapshotWith(ctx, base.Tag, sandbox.RemoveOptions{Cascade: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(removed, ",") != tags[0]+","+base.Tag {
		t.Errorf("cascade removed %v, want %s then %s", removed, tags[0], base.Tag)
	}
	cacheDir := filepath.Join(dataDir, "cache", "memory")
	if _, err := os.Stat(filepath.Join(cacheDir, strings.TrimPrefix(l1Digest, "sha256:"))); !os.IsNotExist(err) {
		t.Errorf("the assembled image of removed %s is left: %v", tags[0], err)
	}
	// The orphaned head is still there (its parent was replaced, not
	// removed with the base), and so is its image.
	if _, err := os.Stat(filepath.Join(cacheDir, strings.TrimPrefix(head.Digest(), "sha256:"))); err != nil {
		t.Errorf("the head's assembled image: %v", err)
	}
}

// allocated is the bytes a file takes on disk.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
