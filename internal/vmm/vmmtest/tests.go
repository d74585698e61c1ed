package vmmtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// testBoot: a fresh VM runs the image and answers on its agent port; a
// requested stop ends it with no exit error.
func (s *suite) testBoot(t *testing.T) {
	m, a := s.boot(t, "boot", "")
	if m.ID() != "boot" || m.Config().MemoryMiB != s.MemoryMiB {
		t.Errorf("machine %q, config %+v", m.ID(), m.Config())
	}
	if m.PID() <= 0 {
		t.Errorf("running machine has pid %d", m.PID())
	}
	call(t, a, "set booted", "ok")
	call(t, a, "get", stateValue("booted"))
	if err := m.Stop(ctx(t)); err != nil {
		t.Fatalf("stop: %v", err)
	}
	waitDone(t, m)
	if err := m.ExitError(); err != nil {
		t.Errorf("requested stop: exit error %v", err)
	}
}

// testRestoreCopyOnWrite: two children of one snapshot start with the
// template's memory, then diverge independently, and neither changes
// the snapshot's memory file.
func (s *suite) testRestoreCopyOnWrite(t *testing.T) {
	snap := s.template(t)
	_, a1 := s.restore(t, snap, "cow1")
	_, a2 := s.restore(t, snap, "cow2")
	call(t, a1, "get", stateValue(snap.value))
	call(t, a2, "get", stateValue(snap.value))
	call(t, a1, "set child-one", "ok")
	call(t, a2, "set child-two", "ok")
	call(t, a1, "get", stateValue("child-one"))
	call(t, a2, "get", stateValue("child-two"))
	if h := hashFile(t, snap.mem); h != snap.memHash {
		t.Fatalf("children wrote the snapshot's memory file %s (copy-on-write broken)", snap.mem)
	}
	// A third child still starts from the template's value.
	_, a3 := s.restore(t, snap, "cow3")
	call(t, a3, "get", stateValue(snap.value))
}

// testPauseResume: a paused guest answers nothing; resumed, it answers
// what was sent meanwhile.
func (s *suite) testPauseResume(t *testing.T) {
	snap := s.template(t)
	m, a := s.restore(t, snap, "pause")
	p, ok := m.(vmm.Pauser)
	skipUnless(t, ok, s.Driver.Name(), "vmm.Pauser")
	c := ctx(t)
	if err := p.Pause(c); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := p.Pause(c); err != nil {
		t.Fatalf("pause of a paused machine: %v (want idempotent)", err)
	}
	if err := a.Send("get"); err != nil {
		t.Fatal(err)
	}
	// A paused guest must not answer: wait a while for a reply that
	// must not come (the only fixed wait of the suite; a pass proves
	// nothing shorter).
	if r, err := a.ReadLine(2 * time.Second); err == nil {
		t.Fatalf("paused guest answered %q", r)
	}
	if err := p.Resume(c); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r, err := a.ReadLine(callTimeout); err != nil || r != stateValue(snap.value) {
		t.Fatalf("after resume: %q, %v", r, err)
	}
	call(t, a, "ping", "pong")
}

// testDiffSnapshot: a running child's diff snapshot holds the pages it
// wrote; the child runs on, and a grandchild restored from the diff sees
// the child's value, not the template's or the child's later one.
func (s *suite) testDiffSnapshot(t *testing.T) {
	skipUnless(t, s.features().DiffSnapshots, s.Driver.Name(), "diff snapshots (vmm.Features.DiffSnapshots)")
	snap := s.template(t)
	m, a := s.restore(t, snap, "diff")
	call(t, a, "set branched", "ok")
	diff := &snapshot{
		state: filepath.Join(s.dir, "diff.state"),
		mem:   filepath.Join(s.dir, "diff.mem"),
		value: "branched",
	}
	index := filepath.Join(s.dir, "diff.index")
	res, err := m.Snapshot(ctx(t), vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: diff.state, MemoryFile: diff.mem, PageIndexFile: index})
	if err != nil {
		t.Fatalf("diff snapshot: %v", err)
	}
	if res.DirtyPages <= 0 || res.PageIndexFile != index {
		t.Errorf("diff result %+v: want the pages the child wrote, listed in %s", res, index)
	}
	ix, err := memlayer.ReadFile(index)
	if err != nil {
		t.Fatalf("page index: %v", err)
	}
	if ix.Pages() == 0 {
		t.Error("page index lists no page")
	}
	diff.mem = res.MemoryFile
	// The child runs on, its later writes its own.
	call(t, a, "get", stateValue("branched"))
	call(t, a, "set after-branch", "ok")
	_, ga := s.restore(t, diff, "diffchild")
	call(t, ga, "get", stateValue("branched"))
	if h := hashFile(t, snap.mem); h != snap.memHash {
		t.Fatal("the diff snapshot wrote its parent's memory file")
	}
}

// testAdopt: after a "daemon restart", the new driver takes the running
// machine over, with its memory, and can kill it.
func (s *suite) testAdopt(t *testing.T) {
	ad, ok := s.Driver.(vmm.Adopter)
	skipUnless(t, ok, s.Driver.Name(), "vmm.Adopter")
	if s.Restart == nil {
		t.Skip("the target has no Restart to let go of a machine")
	}
	snap := s.template(t)
	m, a := s.restore(t, snap, "adopt")
	idm, ok := m.(vmm.Identifiable)
	if !ok {
		t.Fatalf("driver %s is an Adopter, yet its machines are not vmm.Identifiable", s.Driver.Name())
	}
	call(t, a, "set before-restart", "ok")
	spec := vmm.AdoptSpec{MachineConfig: m.Config(), Process: idm.ProcessIdentity()}
	a.Close()
	d2 := s.Restart(t, m)
	if _, ok := d2.(vmm.Adopter); !ok {
		t.Fatalf("Restart returned a %T, not an Adopter", d2)
	}
	am, err := d2.(vmm.Adopter).Adopt(ctx(t), spec)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	t.Cleanup(func() { am.Kill() })
	if am.ID() != m.ID() || am.PID() != spec.Process.PID {
		t.Errorf("adopted %q pid %d, want %q pid %d", am.ID(), am.PID(), m.ID(), spec.Process.PID)
	}
	aa := s.agent(t, am)
	call(t, aa, "get", stateValue("before-restart"))
	if err := am.Kill(); err != nil {
		t.Fatalf("kill adopted: %v", err)
	}
	waitDone(t, am)
	// The process is gone: a second adoption finds nothing.
	if _, err := ad.Adopt(ctx(t), spec); err == nil {
		t.Fatal("adopted a killed machine")
	}
}

// testKill: Kill ends a running machine at once; Kill and Stop are then
// idempotent, and Done stays closed.
func (s *suite) testKill(t *testing.T) {
	snap := s.template(t)
	m, _ := s.restore(t, snap, "kill")
	if err := m.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	waitDone(t, m)
	if err := m.Kill(); err != nil {
		t.Errorf("second kill: %v", err)
	}
	if err := m.Stop(ctx(t)); err != nil {
		t.Errorf("stop after kill: %v", err)
	}
	if pid := m.PID(); pid != 0 {
		t.Errorf("reaped machine reports pid %d", pid)
	}
}

// testRestoreMissing: a snapshot whose state file is gone fails to
// restore (at Prepare or Restore), and leaves no machine running.
func (s *suite) testRestoreMissing(t *testing.T) {
	snap := s.template(t)
	missing := &snapshot{state: filepath.Join(s.dir, "missing.state"), mem: snap.mem}
	s.expectRestoreFails(t, missing, "missing")
}

// testRestoreCorrupt: a state file of garbage fails to restore, and
// leaves no machine running.
func (s *suite) testRestoreCorrupt(t *testing.T) {
	snap := s.template(t)
	bad := &snapshot{state: filepath.Join(s.dir, "corrupt.state"), mem: snap.mem}
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(i*7 + 13)
	}
	if err := os.WriteFile(bad.state, garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	s.expectRestoreFails(t, bad, "corrupt")
}

func (s *suite) expectRestoreFails(t *testing.T, snap *snapshot, id string) {
	t.Helper()
	cfg := s.config(id)
	cfg.MemoryFile = snap.mem
	m, err := s.Driver.Prepare(ctx(t), vmm.PrepareSpec{MachineConfig: cfg, StateFile: snap.state})
	if err != nil {
		return // refused up front
	}
	t.Cleanup(func() { m.Kill() })
	if _, err := m.Restore(ctx(t)); err == nil {
		t.Fatalf("restore of %s succeeded", snap.state)
	} else {
		t.Logf("restore failed as it should: %v", err)
	}
	// The failed machine must not be left running.
	waitDone(t, m)
}

// testBootBadKernel: booting a kernel that does not exist fails, at
// Boot or as the machine's exit, and leaves nothing running.
func (s *suite) testBootBadKernel(t *testing.T) {
	cfg := s.config("badkernel")
	cfg.Image.Kernel = filepath.Join(s.dir, "no-such-kernel")
	m, err := s.Driver.Boot(ctx(t), vmm.BootSpec{MachineConfig: cfg})
	if err != nil {
		t.Logf("boot failed as it should: %v", err)
		return
	}
	t.Cleanup(func() { m.Kill() })
	waitDone(t, m)
	if m.ExitError() == nil {
		t.Fatal("a VM without a kernel exited with no error")
	}
}
