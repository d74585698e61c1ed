package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestChangedMemoryFileRefusesForks: a snapshot whose memory file was
// touched after commit is refused (409 class, saying what to do), its
// pooled VMMs are dropped, and it stays refused.
func TestChangedMemoryFileRefusesForks(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 1)
	ctx := context.Background()
	snap := e.mustSnap(t, "base")
	e.Warm("base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
	if _, err := e.Fork(ctx, "base", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
	if err := e.SnapshotIntact(snap); err != nil {
		t.Fatalf("untouched snapshot: %v", err)
	}

	// A touch (same content) is verified again and accepted.
	mem := snap.Path(snapshot.MemoryFile)
	st, err := os.Stat(mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(mem, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := e.SnapshotIntact(snap); err != nil {
		t.Fatalf("touched, same content: %v", err)
	}
	// A write, even with the mtime put back, is caught.
	f, err := os.OpenFile(mem, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	f.ReadAt(b[:], 0)
	if _, err := f.WriteAt([]byte{b[0] ^ 0xff}, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(mem, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	restores := d.restores.Load()
	for i := range 2 {
		_, err := e.Fork(ctx, "base", 1)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "file memory changed since it was committed") ||
			!strings.Contains(err.Error(), "re-create it") {
			t.Fatalf("fork %d of a changed snapshot: %v", i, err)
		}
	}
	if d.restores.Load() != restores {
		t.Fatal("a clone of a changed snapshot was restored")
	}
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 0 })
	if err := e.SnapshotIntact(snap); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("SnapshotIntact of the changed snapshot: %v", err)
	}
	// Refills find it refused too: once the refill has given up, the pool
	// is still empty.
	e.Warm("base")
	p := e.poolFor(snap)
	waitFor(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.filling
	})
	if n := e.PoolSize(snap.ID); n != 0 {
		t.Fatalf("%d VMMs pooled for a changed snapshot", n)
	}
}

// TestChangedAssembledImageIsAssembledAgain: the memory image clones map
// (here the copy in MemoryDir) is stamped when assembled; one written
// afterwards is replaced by a fresh assembly from the (intact) snapshot.
func TestChangedAssembledImageIsAssembledAgain(t *testing.T) {
	memDir := t.TempDir()
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.MemoryDir = memDir })
	ctx := context.Background()
	if _, err := e.Fork(ctx, "base", 1); err != nil {
		t.Fatal(err)
	}
	img := e.mem.path(e.mustSnap(t, "base").Digest())
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("assembled image: %v", err)
	}
	if err := os.WriteFile(img, []byte("tampered"), 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Fork(ctx, "base", 1); err != nil {
		t.Fatalf("fork after the image changed: %v", err)
	}
	// The snapshot's memory file holds its own name (newFakeEngine).
	if data, err := os.ReadFile(img); err != nil || string(data) != snapshot.MemoryFile {
		t.Fatalf("image not assembled again: %q %v", data, err)
	}
}

// withFreeSpace makes statfs report avail bytes available until the test
// ends.
func withFreeSpace(t *testing.T, avail uint64) {
	t.Helper()
	statfs = func(path string, st *unix.Statfs_t) error {
		if err := unix.Statfs(path, st); err != nil {
			return err
		}
		st.Bavail = avail / uint64(st.Bsize)
		return nil
	}
	t.Cleanup(func() { statfs = unix.Statfs })
}

func stagingDirs(t *testing.T, e *Engine) []string {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(e.Store().Root(), ".staging-*"))
	return left
}

// TestBranchNeedsFreeSpace: a branch that would not fit is refused before
// the sandbox is paused, naming what it needs and what is free.
func TestBranchNeedsFreeSpace(t *testing.T) {
	gate := make(chan struct{}) // a Snapshot call would block: it must not come
	e, _ := newFakeEngine(t, &fakeDriver{snapshotGate: gate}, 0)
	ctx := context.Background()
	sbs, err := e.Fork(ctx, "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	withFreeSpace(t, 10<<20)
	_, err = e.Branch(ctx, sbs[0].ID, BranchOptions{Tag: "b1", Mode: BranchFull})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "needs 65 MiB free") || !strings.Contains(err.Error(), "10 MiB available") {
		t.Fatalf("branch on a full disk: %v", err)
	}
	if _, err := e.Store().Get("b1"); !errdefs.IsNotFound(err) {
		t.Fatalf("tag left: %v", err)
	}
	if left := stagingDirs(t, e); len(left) != 0 {
		t.Fatalf("staging left: %v", left)
	}
	if sbs[0].State() != apiv1.StateRunning {
		t.Fatal("source sandbox not running")
	}
}

// TestNoSpaceDuringCommit: the file system fills up between the check and
// the commit (ENOSPC writing the manifest): the branch fails saying so,
// and leaves no tag and no staging directory.
func TestNoSpaceDuringCommit(t *testing.T) {
	dataDir := t.TempDir()
	if err := unix.Mount("tmpfs", dataDir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dataDir, unix.MNT_DETACH) })
	filler := filepath.Join(dataDir, "filler")
	d := &fakeDriver{}
	d.afterSnapshot = func() {
		f, err := os.Create(filler)
		if err != nil {
			return
		}
		defer f.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Write(buf); err != nil {
				return // ENOSPC: full
			}
		}
	}
	e, _ := newFakeEngineWith(t, d, 0, func(c *Config) { c.DataDir = dataDir })
	ctx := context.Background()
	sbs, err := e.Fork(ctx, "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	withFreeSpace(t, 1<<40) // the check up front passes; the disk fills later
	_, err = e.Branch(ctx, sbs[0].ID, BranchOptions{Tag: "full1", Mode: BranchFull})
	if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "filled up") {
		t.Fatalf("branch that hits ENOSPC: %v", err)
	}
	if _, err := e.Store().Get("full1"); !errdefs.IsNotFound(err) {
		t.Fatalf("tag left: %v", err)
	}
	if left := stagingDirs(t, e); len(left) != 0 {
		t.Fatalf("staging left: %v", left)
	}
	os.Remove(filler)
	d.afterSnapshot = nil
	if _, err := e.Branch(ctx, sbs[0].ID, BranchOptions{Tag: "full1", Mode: BranchFull}); err != nil {
		t.Fatalf("branch once space is free: %v", err)
	}
}

// TestImageBeingCommittedIsNotRemoved: an assembly renames its image into
// place, then writes its stamp. A fork that looks in between (without
// the image's lock) must wait for the lock, not remove the image as
// unstamped under the assembler (which then failed, or handed out a
// path that no longer existed).
func TestImageBeingCommittedIsNotRemoved(t *testing.T) {
	memDir := t.TempDir()
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.MemoryDir = memDir })
	snap := e.mustSnap(t, "base")
	digest := snap.Digest()
	img := e.mem.path(digest)
	// An assembly between its rename and its stamp: it holds the lock.
	unlock := e.mem.lock(digest)
	if err := os.WriteFile(img, []byte(snapshot.MemoryFile), 0o400); err != nil {
		t.Fatal(err)
	}
	type result struct {
		path string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		p, err := e.memoryImage(snap)
		done <- result{p, err}
	}()
	// The fork has looked and waits for the lock (its goroutine is in
	// memCache.lock).
	waitFor(t, func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), ".(*memCache).lock(")
	})
	if _, err := os.Stat(img); err != nil {
		unlock()
		t.Fatalf("image removed while its assembly held the lock: %v", err)
	}
	if err := e.mem.writeStamp(img); err != nil {
		t.Fatal(err)
	}
	unlock()
	r := <-done
	if r.err != nil || r.path != img {
		t.Fatalf("memoryImage = %q, %v", r.path, r.err)
	}
	if e.mem.imageChange(img) != "" {
		t.Fatalf("image after the fork: %s", e.mem.imageChange(img))
	}
}

// TestUnreadableStampsFailOneCheck: stamps that cannot be read (here a
// directory in their place; EIO or EMFILE in real life) fail the fork
// that met them, but say nothing about the files: the snapshot is not
// marked failed for the rest of the daemon's life, and forks once the
// stamps read again.
func TestUnreadableStampsFailOneCheck(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	ctx := context.Background()
	snap := e.mustSnap(t, "base")
	stamps := snap.Path(snapshot.StampFile)
	saved, err := os.ReadFile(stamps)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(stamps); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(stamps, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Fork(ctx, "base", 1); err == nil || errdefs.IsFailedPrecondition(err) {
		t.Fatalf("fork with unreadable stamps: %v", err)
	}
	if err := os.Remove(stamps); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stamps, saved, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := e.SnapshotIntact(snap); err != nil {
		t.Fatalf("snapshot refused after its stamps read again: %v", err)
	}
	if _, err := e.Fork(ctx, "base", 1); err != nil {
		t.Fatalf("fork after the stamps read again: %v", err)
	}
}
