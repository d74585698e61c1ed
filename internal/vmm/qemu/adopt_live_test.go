package qemu

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// TestBranchAfterAdoptionMidLiveBranch plays a daemon killed during a
// live branch: QEMU still writes the background snapshot (here into a
// FIFO this test drains when it chooses, in place of the spool) when a
// new driver adopts it. The adopted machine's first branch waits for that
// snapshot to end rather than fail ("a migration process in progress") or
// cancel it (which would leave guest RAM write-protected and freeze the
// guest), and the capability is off afterwards.
func TestBranchAfterAdoptionMidLiveBranch(t *testing.T) {
	sf := buildShmTemplate(t)
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	out, err := os.MkdirTemp("/dev/shm", "forkd-adopt-live-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	c, ca := sf.src.restore(t, sf.d, "bad")
	call(t, ca, "set before-death", "ok")

	// The dying daemon's live branch, up to QEMU's start of the snapshot.
	fifo := filepath.Join(out, "stream")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = c.QMP().ExecuteWithFiles(ctx, "getfd", map[string]string{"fdname": branchFD}, nil, w)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QMP().Execute(ctx, "migrate-set-capabilities", backgroundSnapshot(true), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.QMP().Execute(ctx, "migrate", map[string]string{"uri": "fd:" + branchFD}, nil); err != nil {
		t.Fatal(err)
	}
	// It had handed over another file, not yet taken back.
	stray, err := os.Create(filepath.Join(out, "stray"))
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	if _, err := c.addFdset(ctx, stray, stateFD); err != nil {
		t.Fatal(err)
	}
	// The daemon dies: its connections close, QEMU runs on.
	ca.Close()
	c.QMP().Close()

	d2 := newTestDriver(t, Config{})
	vm, err := d2.Adopt(ctx, vmm.AdoptSpec{MachineConfig: c.Config(), Process: c.ProcessIdentity()})
	if err != nil {
		t.Fatal(err)
	}
	m := vm.(*Machine)
	if sets := queryFdsets(t, m); len(sets) != 0 {
		t.Errorf("the adopted QEMU still holds descriptor sets %+v", sets)
	}
	var info migrationInfo
	if err := m.QMP().Execute(ctx, "query-migrate", nil, &info); err != nil {
		t.Fatal(err)
	}
	if ended, _ := m.migrationEnded(info, ""); ended || info.Status == "none" {
		t.Fatalf("the orphan snapshot is %q at adoption, want it still running (the FIFO is full)", info.Status)
	}

	waiting := make(chan struct{})
	branchHook = func(p string) error {
		if p == "settle-wait" {
			close(waiting)
		}
		return nil
	}
	t.Cleanup(func() { branchHook = nil })
	spec := branchSpec(out, "after", vmm.SnapshotLive)
	type result struct {
		res vmm.SnapshotResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := m.Snapshot(ctx, spec)
		done <- result{res, err}
	}()
	select {
	case <-waiting:
	case res := <-done:
		t.Fatalf("the branch did not wait for the orphan snapshot: %+v %v", res.res, res.err)
	}
	// Nobody reads the orphan's stream; here it drains, as the spool
	// does at disk speed.
	go io.Copy(io.Discard, r)
	res := <-done
	if res.err != nil {
		t.Fatalf("branch after the orphan snapshot: %v", res.err)
	}
	assertCapOff(t, m)
	conn, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := testguest.NewAgent(conn)
	defer a.Close()
	checkRunning(t, m, a, "before-death")
	call(t, a, "set after-adoption", "ok")
	g, ga := sf.src.from(res.res).restore(t, sf.d, "badg")
	checkRunning(t, g, ga, "before-death")
	// A diff branch does not inherit the capability.
	if _, err := m.Snapshot(ctx, branchSpec(out, "diff", vmm.SnapshotDiff)); err != nil {
		t.Fatal(err)
	}
	checkRunning(t, m, a, "after-adoption")
}
