package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestPackChain moves a chain of two diff layers on a template to an empty
// data directory through one archive of its head, and forks the head
// there: the child has the files written before each branch. Then the
// first layer's own archive unpacks next to it, reusing the template that
// is there already.
func TestPackChain(t *testing.T) {
	e := newEngine(t, 0)
	base := newTemplate(t, e, "minimal")
	ctx := context.Background()
	id := snapshot.NewID()
	tags := []string{"it-pack-l1-" + id, "it-pack-l2-" + id}
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
		run(t, a, "sh", "-c", "echo "+tag+" > /root/packed"+string(rune('1'+i)))
		res, err := e.Branch(ctx, kids[0].ID, sandbox.BranchOptions{Tag: tag})
		if err != nil {
			t.Fatalf("branch %s: %v", tag, err)
		}
		e.Kill(ctx, []string{kids[0].ID})
		if res.Snapshot.Parent == nil || res.Snapshot.Parent.Tag != from {
			t.Fatalf("%s is not a layer on %s: parent %+v", tag, from, res.Snapshot.Parent)
		}
		from = tag
	}

	packTo := func(tag string) (string, pack.PackStats) {
		path := filepath.Join(t.TempDir(), tag+".forkd.tar.zst")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, err := pack.Pack(ctx, dataDir, tag, f, pack.PackOptions{})
		if err != nil {
			t.Fatalf("pack %s: %v", tag, err)
		}
		return path, st
	}
	unpackFrom := func(path, dst string, opts pack.UnpackOptions) (*snapshot.Snapshot, pack.UnpackStats) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		snap, st, err := pack.Unpack(ctx, dst, f, opts)
		if err != nil {
			t.Fatalf("unpack %s: %v", filepath.Base(path), err)
		}
		return snap, st
	}

	headArchive, pst := packTo(tags[1])
	t.Logf("packed %v: %d MB logical into %.1f MB in %v", pst.Snapshots, pst.LogicalBytes>>20, float64(pst.ArchiveBytes)/1e6, pst.Duration)
	if want := []string{base.Tag, tags[0], tags[1]}; !slices.Equal(pst.Snapshots, want) {
		t.Errorf("packed %v, want %v", pst.Snapshots, want)
	}

	fresh := t.TempDir()
	head, ust := unpackFrom(headArchive, fresh, pack.UnpackOptions{})
	if want := []string{base.Tag, tags[0], tags[1]}; !slices.Equal(ust.Added, want) || len(ust.ImagesAdded) != 1 {
		t.Errorf("unpack: %+v", ust)
	}
	e2 := newEngineOn(t, fresh, 0)
	chain, err := e2.Store().Chain(head)
	if err != nil || len(chain) != 3 {
		t.Fatalf("chain of the unpacked head: %d, %v", len(chain), err)
	}
	kids, err := e2.Fork(ctx, tags[1], 1)
	if err != nil {
		t.Fatalf("fork from the unpacked head: %v", err)
	}
	if got := run(t, agentOf(t, e2, kids[0].ID), "cat", "/root/packed1", "/root/packed2"); got != strings.Join(tags, "\n") {
		t.Errorf("child of the unpacked head has %q", got)
	}
	e2.Kill(ctx, []string{kids[0].ID})

	// The first layer alone, under another tag: the template is reused.
	l1Archive, _ := packTo(tags[0])
	moved, ust := unpackFrom(l1Archive, fresh, pack.UnpackOptions{Tag: "moved-l1"})
	if !slices.Equal(ust.Reused, []string{base.Tag}) || !slices.Equal(ust.Added, []string{"moved-l1"}) {
		t.Errorf("unpack of the first layer: %+v", ust)
	}
	if moved.Parent == nil || moved.Parent.Tag != base.Tag {
		t.Errorf("moved-l1: parent %+v", moved.Parent)
	}
	kids, err = e2.Fork(ctx, "moved-l1", 1)
	if err != nil {
		t.Fatalf("fork from the moved first layer: %v", err)
	}
	a := agentOf(t, e2, kids[0].ID)
	if got := run(t, a, "cat", "/root/packed1"); got != tags[0] {
		t.Errorf("child of moved-l1 has %q", got)
	}
	if got := run(t, a, "sh", "-c", "test -e /root/packed2 && echo yes || echo no"); got != "no" {
		t.Errorf("child of moved-l1 has the second layer's file: %s", got)
	}
}
