package fakevmm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

const testMiB = 4

// fixture is a template snapshot of a guest that stored "tmpl".
type fixture struct {
	d          *Driver
	dir        string
	img        vmm.Image
	state, mem string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{d: New(), dir: t.TempDir(), img: testImage(t)}
	f.state, f.mem = filepath.Join(f.dir, "tmpl.state"), filepath.Join(f.dir, "tmpl.mem")
	cfg := f.config("tmpl")
	cfg.MemoryFile = f.mem
	m, err := f.d.Boot(context.Background(), vmm.BootSpec{MachineConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	call(t, m, "set tmpl", "ok")
	if _, err := m.Snapshot(context.Background(), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: f.state, StopAfter: true}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) config(id string) vmm.MachineConfig {
	return vmm.MachineConfig{ID: id, RunDir: filepath.Join(f.dir, id), Image: f.img, MemoryMiB: testMiB, VCPUs: 1}
}

// restore restores a child of the template; it ends with t.
func (f *fixture) restore(t *testing.T, id string) *Machine {
	t.Helper()
	cfg := f.config(id)
	cfg.MemoryFile = f.mem
	m, err := f.d.Prepare(context.Background(), vmm.PrepareSpec{MachineConfig: cfg, StateFile: f.state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	if _, err := m.Restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m.(*Machine)
}

// call sends line on a new agent connection and checks the reply.
func call(t *testing.T, m vmm.Machine, line, want string) {
	t.Helper()
	conn, err := m.DialAgent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if r, err := testguest.NewAgent(conn).Call(line, time.Minute); err != nil || r != want {
		t.Fatalf("%s: %q: %q, %v; want %q", m.ID(), line, r, err, want)
	}
}

// A diff layer holds only the pages the clone wrote; put over the clone's
// memory file it is the complete image a plain diff writes.
func TestDiffLayerIsTheCompleteImageOverItsBase(t *testing.T) {
	f := newFixture(t)
	m := f.restore(t, "child")
	call(t, m, "set "+strings.Repeat("x", valueMax), "ok")
	full, layer, index := filepath.Join(f.dir, "full.mem"), filepath.Join(f.dir, "layer.mem"), filepath.Join(f.dir, "layer.index")
	ctx := context.Background()
	if _, err := m.Snapshot(ctx, vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(f.dir, "full.state"), MemoryFile: full}); err != nil {
		t.Fatal(err)
	}
	res, err := m.Snapshot(ctx, vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(f.dir, "layer.state"),
		MemoryFile: layer, PageIndexFile: index, Layer: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.DirtyPages != 1 || res.BytesWritten >= 2*pageSize+1024 {
		t.Errorf("layer of one written page: %+v", res)
	}
	ix, err := memlayer.ReadFile(index)
	if err != nil || ix.Pages() != 1 || !ix.Contains(valueOff/pageSize) {
		t.Fatalf("index %+v, %v: want the value's page", ix, err)
	}
	img := filepath.Join(f.dir, "assembled.mem")
	copyFile(t, f.mem, img)
	dst, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	lf, err := os.Open(layer)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if _, err := memlayer.Apply(dst, lf, ix); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, img), readFile(t, full)) {
		t.Fatal("template image + layer differs from the complete diff image")
	}
}

// Snapshots leave no staging files behind, and a template that would run
// on over its children's memory is refused.
func TestSnapshotFiles(t *testing.T) {
	f := newFixture(t)
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("staging file left behind: %s", e.Name())
		}
	}
	cfg := f.config("tmpl2")
	cfg.MemoryFile = filepath.Join(f.dir, "tmpl2.mem")
	m, err := f.d.Boot(context.Background(), vmm.BootSpec{MachineConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	_, err = m.Snapshot(context.Background(), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: filepath.Join(f.dir, "tmpl2.state")})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("snapshot of a shared template without StopAfter: %v", err)
	}
	call(t, m, "get", "state=") // and it runs on
}

// A restore that does not fit the snapshot fails, naming the mismatch,
// and ends the machine.
func TestRestoreMismatch(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("big")
	cfg.MemoryFile, cfg.MemoryMiB = f.mem, 2*testMiB
	m, err := f.d.Prepare(context.Background(), vmm.PrepareSpec{MachineConfig: cfg, StateFile: f.state})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Restore(context.Background())
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "snapshotted machine's configuration") {
		t.Fatalf("restore with twice the memory: %v", err)
	}
	<-m.Done()
	if m.ExitError() == nil || m.PID() != 0 {
		t.Errorf("failed restore: exit error %v, pid %d", m.ExitError(), m.PID())
	}
	_, err = f.d.Prepare(context.Background(), vmm.PrepareSpec{MachineConfig: f.config("uffd"), StateFile: f.state, MemoryBackend: vmm.MemoryBackendUffd})
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("uffd backend: %v", err)
	}
}

// Adopt refuses a machine whose identity is not the recorded one, and
// ends one that was never restored.
func TestAdoptRefusals(t *testing.T) {
	f := newFixture(t)
	m := f.restore(t, "run")
	id := m.ProcessIdentity()
	stale := id
	stale.StartTime++
	_, err := New().Adopt(context.Background(), vmm.AdoptSpec{MachineConfig: m.Config(), Process: stale})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("adopt with another start time: %v", err)
	}
	cfg := f.config("prepared")
	cfg.MemoryFile = f.mem
	p, err := f.d.Prepare(context.Background(), vmm.PrepareSpec{MachineConfig: cfg, StateFile: f.state})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New().Adopt(context.Background(), vmm.AdoptSpec{MachineConfig: cfg, Process: p.(*Machine).ProcessIdentity()})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("adopt of a prepared machine: %v", err)
	}
	<-p.Done()
	if _, err := f.d.Prepare(context.Background(), vmm.PrepareSpec{MachineConfig: m.Config(), StateFile: f.state}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second machine in a live run dir: %v", err)
	}
}

// A line longer than the bound is refused; the channel stays usable, and
// a new connection supersedes the old one.
func TestAgentChannel(t *testing.T) {
	f := newFixture(t)
	m := f.restore(t, "agent")
	conn, err := m.DialAgent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a := testguest.NewAgent(conn)
	if r, err := a.Call("set "+strings.Repeat("y", 2*maxLine), time.Minute); err != nil || !strings.HasPrefix(r, "error: line longer") {
		t.Fatalf("overlong line: %q, %v", r, err)
	}
	if r, err := a.Call("set "+strings.Repeat("y", valueMax+1), time.Minute); err != nil || !strings.HasPrefix(r, "error: value longer") {
		t.Fatalf("overlong value: %q, %v", r, err)
	}
	if r, err := a.Call("get", time.Minute); err != nil || r != "state=tmpl" {
		t.Fatalf("get after refusals: %q, %v", r, err)
	}
	call(t, m, "ping", "pong")
	if _, err := a.Call("ping", time.Minute); err == nil {
		t.Error("a superseded connection still answers")
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.WriteFile(dst, readFile(t, src), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
