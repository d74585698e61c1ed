package vmmtest

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// suite is one Run: the target and the template its subtests share.
type suite struct {
	Target
	dir string

	tmplOnce sync.Once
	tmpl     *snapshot
	tmplErr  string
}

// snapshot is a snapshot the suite restores from: its files and the
// value the snapshotted guest had stored.
type snapshot struct {
	state, mem string
	value      string
	memHash    string // of mem when it was written
}

// config is the machine configuration of the machine named id.
func (s *suite) config(id string) vmm.MachineConfig {
	return vmm.MachineConfig{
		ID:              id,
		RunDir:          filepath.Join(s.dir, id),
		Image:           s.Image,
		MemoryMiB:       s.MemoryMiB,
		VCPUs:           1,
		ConsoleLog:      filepath.Join(s.dir, id+".console"),
		TrackDirtyPages: s.features().DirtyPageTracking,
	}
}

// boot boots machine id with its RAM in memFile ("": none) and waits
// for its agent; both end with t.
func (s *suite) boot(t *testing.T, id, memFile string) (vmm.Machine, *testguest.Agent) {
	t.Helper()
	cfg := s.config(id)
	cfg.MemoryFile = memFile
	m, err := s.Driver.Boot(ctx(t), vmm.BootSpec{MachineConfig: cfg})
	if err != nil {
		t.Fatalf("boot %s: %v", id, err)
	}
	t.Cleanup(func() { m.Kill() })
	return m, s.agent(t, m)
}

// agent dials m's agent and waits until it answers.
func (s *suite) agent(t *testing.T, m vmm.Machine) *testguest.Agent {
	t.Helper()
	conn, err := m.DialAgent(ctx(t))
	if err != nil {
		t.Fatalf("%s: dial agent: %v", m.ID(), err)
	}
	a := testguest.NewAgent(conn)
	t.Cleanup(func() { a.Close() })
	r, err := a.Call("ping", vmTimeout)
	// A guest snapshotted in the middle of a command finishes it after
	// a restore: that reply may come before the pong (the line protocol
	// has no handshake to discard it).
	for i := 0; i < 3 && err == nil && r != "pong"; i++ {
		r, err = a.ReadLine(callTimeout)
	}
	if err != nil || r != "pong" {
		t.Fatalf("%s: ping: %q, %v; console:\n%s", m.ID(), r, err, m.ConsoleTail(2000))
	}
	return a
}

// call sends line and checks the reply.
func call(t *testing.T, a *testguest.Agent, line, want string) {
	t.Helper()
	if r, err := a.Call(line, callTimeout); err != nil || r != want {
		t.Fatalf("%q: %q, %v; want %q", line, r, err, want)
	}
}

// template returns the suite's template snapshot: a booted guest that
// stored a value, snapshotted (full) and stopped. It is made once; a
// failure fails every test that needs it.
func (s *suite) template(t *testing.T) *snapshot {
	t.Helper()
	s.tmplOnce.Do(func() {
		ok := false
		defer func() {
			if !ok && s.tmplErr == "" {
				s.tmplErr = "building the template failed (see the first test that needed it)"
			}
		}()
		s.tmpl = s.takeTemplate(t)
		ok = true
	})
	if s.tmpl == nil {
		t.Fatal(s.tmplErr)
	}
	return s.tmpl
}

func (s *suite) takeTemplate(t *testing.T) *snapshot {
	t.Helper()
	snap := &snapshot{
		state: filepath.Join(s.dir, "tmpl.state"),
		mem:   filepath.Join(s.dir, "tmpl.mem"),
		value: "template-value",
	}
	m, a := s.boot(t, "tmpl", snap.mem)
	call(t, a, "set "+snap.value, "ok")
	a.Close()
	res, err := m.Snapshot(ctx(t), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: snap.state, MemoryFile: snap.mem, StopAfter: true})
	if err != nil {
		t.Fatalf("template snapshot: %v", err)
	}
	waitDone(t, m)
	if res.StateFile != snap.state || res.MemoryFile == "" {
		t.Fatalf("snapshot result %+v: want the state file %s and a memory file", res, snap.state)
	}
	snap.mem = res.MemoryFile
	snap.memHash = hashFile(t, snap.mem)
	return snap
}

// restore prepares machine id from snap and restores it; it returns
// once its agent answers.
func (s *suite) restore(t *testing.T, snap *snapshot, id string) (vmm.Machine, *testguest.Agent) {
	t.Helper()
	cfg := s.config(id)
	cfg.MemoryFile = snap.mem
	m, err := s.Driver.Prepare(ctx(t), vmm.PrepareSpec{MachineConfig: cfg, StateFile: snap.state})
	if err != nil {
		t.Fatalf("prepare %s: %v", id, err)
	}
	t.Cleanup(func() { m.Kill() })
	if _, err := m.Restore(ctx(t)); err != nil {
		t.Fatalf("restore %s: %v; console:\n%s", id, err, m.ConsoleTail(2000))
	}
	return m, s.agent(t, m)
}

// waitDone waits until m's process has exited.
func waitDone(t *testing.T, m vmm.Machine) {
	t.Helper()
	select {
	case <-m.Done():
	case <-ctx(t).Done():
		t.Fatalf("%s still running after %v", m.ID(), vmTimeout)
	}
}

// hashFile is the SHA-256 of a file's contents.
func hashFile(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// skipUnless skips t, naming the capability the driver lacks.
func skipUnless(t *testing.T, ok bool, driver, capability string) {
	t.Helper()
	if !ok {
		t.Skipf("driver %s does not offer %s", driver, capability)
	}
}

// stateValue is the reply of "get" for a stored value.
func stateValue(v string) string { return "state=" + strings.TrimSpace(v) }
