package firecracker

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/vmm"
	"github.com/forkd-dev/forkd/internal/vmm/firecracker/fctest"
)

// Firecracker's Diff holds the pages written since the previous snapshot;
// a branch's layer must hold every page written since the restore. The
// driver folds each diff into its accumulator: the second layer holds the
// first diff's pages too, and a complete image is the base with all of
// them over it. (The fake writes fctest.DiffPages into each Diff.)
func TestDiffLayersAccumulate(t *testing.T) {
	d, log := newTestDriver(t, Config{})
	img := testImage(t)
	full := fullTemplate(t, d, img)
	dir := t.TempDir()
	// The template's memory: data in its first MiB, holes after.
	data := make([]byte, 1<<20)
	rand.Read(data)
	if err := writeAt(full.MemoryFile, data, 0); err != nil {
		t.Fatal(err)
	}
	base, _ := os.ReadFile(full.MemoryFile)

	cfg := testConfig(t, "child", img)
	cfg.MemoryFile, cfg.TrackDirtyPages = full.MemoryFile, true
	child, err := d.Prepare(testCtx(t), vmm.PrepareSpec{MachineConfig: cfg, StateFile: full.StateFile})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Kill()
	if _, err := child.Restore(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	written := map[int64][]byte{} // page -> its latest bytes
	layer := func(n int) (string, *memlayer.Index) {
		t.Helper()
		mem, index := filepath.Join(dir, "layer.mem"), filepath.Join(dir, "layer.index")
		res, err := child.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(dir, "layer.state"), MemoryFile: mem, PageIndexFile: index, Layer: true})
		if err != nil {
			t.Fatalf("diff %d: %v", n, err)
		}
		for _, p := range fctest.DiffPages(n) {
			written[p] = fctest.DiffPage(n, p)
		}
		ix, err := memlayer.ReadFile(index)
		if err != nil {
			t.Fatal(err)
		}
		if res.PageIndexFile != index || res.DirtyPages != int64(len(written)) || ix.Pages() != uint64(len(written)) {
			t.Fatalf("diff %d: result %+v, index of %d pages; want the %d pages written since the restore", n, res, ix.Pages(), len(written))
		}
		return mem, ix
	}
	layer(1)
	mem, ix := layer(2)
	var got []int64
	for _, e := range ix.Extents {
		for p := e.First; p < e.First+e.Count; p++ {
			got = append(got, int64(p))
		}
	}
	want := []int64{1, 2, 101, 102}
	if !slices.Equal(got, want) {
		t.Fatalf("the second layer lists pages %v, want %v (the first diff's with the second's)", got, want)
	}
	b, _ := os.ReadFile(mem)
	for p, content := range written {
		if !bytes.Equal(b[p*4096:(p+1)*4096], content) {
			t.Errorf("the second layer's page %d is not the latest written", p)
		}
	}

	// A complete image: the base with every written page over it.
	img3 := filepath.Join(dir, "complete.mem")
	if _, err := child.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(dir, "complete.state"), MemoryFile: img3}); err != nil {
		t.Fatal(err)
	}
	for _, p := range fctest.DiffPages(3) {
		written[p] = fctest.DiffPage(3, p)
	}
	expect := slices.Clone(base)
	for p, content := range written {
		copy(expect[p*4096:], content)
	}
	if b, _ := os.ReadFile(img3); !bytes.Equal(b, expect) {
		t.Error("the complete diff image is not the base with every written page over it")
	}

	// A full snapshot of the child pauses for a Diff only, and is
	// completed from the base after the guest resumes.
	full4 := filepath.Join(dir, "full.mem")
	if _, err := child.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: filepath.Join(dir, "full.state"), MemoryFile: full4}); err != nil {
		t.Fatal(err)
	}
	for _, p := range fctest.DiffPages(4) {
		copy(expect[p*4096:], fctest.DiffPage(4, p))
	}
	if b, _ := os.ReadFile(full4); !bytes.Equal(b, expect) {
		t.Error("the full snapshot is not the base with every written page over it")
	}
	if b := body(t, calls(t, log), "PUT", "/snapshot/create"); b["snapshot_type"] != "Diff" {
		t.Errorf("a full snapshot of a restored, tracked machine asked Firecracker for %v, want a Diff", b["snapshot_type"])
	}

	// A booted machine has no restore point to be relative to.
	tm := boot(t, d, func() vmm.MachineConfig { c := testConfig(t, "booted", img); c.TrackDirtyPages = true; return c }())
	_, err = tm.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(dir, "b.state"), MemoryFile: filepath.Join(dir, "b.mem"), PageIndexFile: filepath.Join(dir, "b.index"), Layer: true})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("a layer of a booted machine: %v", err)
	}
}
