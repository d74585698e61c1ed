package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/uffd/uffdtest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// fakeDriver is a vmm.Driver whose machines are goroutines: each runs the
// real agent transport (agentconn.Serve) on one end of a net.Pipe, with a
// tiny handler. It lets the engine's fork path, pool and teardown be tested
// without QEMU.
type fakeDriver struct {
	// failRestore makes the n-th Restore (1-based) fail; 0 never.
	failRestore int64
	restores    atomic.Int64
	// identities counts identities given after the hello (hand-outs of
	// children restored ahead).
	identities atomic.Int64
	// failIdentity, while set, makes identity calls after the hello
	// fail (a pooled child whose guest broke while it waited).
	failIdentity atomic.Bool
	// rehearse, if set, answers the agent's rehearse requests (unset:
	// 404, an agent that predates them); rehearsals counts them.
	rehearse   http.HandlerFunc
	rehearsals atomic.Int64
	// restoreDelay slows every Restore (to cancel a fork mid-way).
	restoreDelay time.Duration
	// snapshotGate, if set, holds every Snapshot until it is closed;
	// snapshotErr, if set, is what Snapshot then returns.
	snapshotGate chan struct{}
	snapshotErr  error
	// afterSnapshot, if set, runs once Snapshot wrote its files.
	afterSnapshot func()
	// holdRestore makes the n-th Restore (1-based) wait until holdGate
	// is closed; 0 never.
	holdRestore int64
	holdGate    chan struct{}

	// restorable, if set, is CanRestore's answer for a snapshot's
	// version (vmm.RestoreChecker); unset, every version restores.
	restorable func(version string) error
	// agentAfterRestore makes the driver report it (vmm.Features) and
	// its machines refuse DialAgent before Restore, as Firecracker's
	// vsock does.
	agentAfterRestore bool
	// helloDelay slows every agent's answer to its HELLO; helloAnswered
	// is when the last one answered and clock the clock (UnixNano) of
	// the last identity applied, by HELLO or identity call.
	helloDelay    time.Duration
	helloAnswered atomic.Int64
	clock         atomic.Int64
	// uffd makes the driver offer the uffd memory backend: a machine
	// prepared with it has, at Restore, a child process (package
	// uffdtest) attach to the page server and read all of its memory
	// through it; uffdDigests are the SHA-256s it read, in order.
	uffd        bool
	uffdDigests []string

	mu       sync.Mutex
	machines []*fakeMachine
}

func (d *fakeDriver) CanRestore(version string) error {
	if d.restorable == nil {
		return nil
	}
	return d.restorable(version)
}

var (
	_ vmm.Driver          = (*fakeDriver)(nil)
	_ vmm.RestoreChecker  = (*fakeDriver)(nil)
	_ vmm.FeatureReporter = (*fakeDriver)(nil)
)

func (d *fakeDriver) Name() string                            { return "fake" }
func (d *fakeDriver) Version(context.Context) (string, error) { return "1", nil }
func (d *fakeDriver) Boot(context.Context, vmm.BootSpec) (vmm.Machine, error) {
	return nil, fmt.Errorf("fake driver cannot boot: %w", errdefs.ErrNotImplemented)
}

func (d *fakeDriver) Prepare(ctx context.Context, spec vmm.PrepareSpec) (vmm.Machine, error) {
	host, guest := net.Pipe()
	if spec.MemoryBackend == vmm.MemoryBackendUffd && !d.uffd {
		return nil, fmt.Errorf("fake driver: no uffd backend: %w", errdefs.ErrNotImplemented)
	}
	m := &fakeMachine{d: d, cfg: spec.MachineConfig, uffdSocket: spec.UffdSocket, host: host, guest: guest, done: make(chan struct{}), pid: os.Getpid()}
	d.mu.Lock()
	d.machines = append(d.machines, m)
	d.mu.Unlock()
	return m, nil
}

// alive counts machines not yet killed.
func (d *fakeDriver) alive() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, m := range d.machines {
		select {
		case <-m.done:
		default:
			n++
		}
	}
	return n
}

type fakeMachine struct {
	d           *fakeDriver
	cfg         vmm.MachineConfig
	host, guest net.Conn
	pid         int
	once        sync.Once
	done        chan struct{}
	exitErr     error
	cpu         atomic.Int64 // SetCPULimit's last millicores
	restored    atomic.Bool
	uffdSocket  string // set: the uffd backend
	// uffdGuest is the process whose memory the page server serves
	// (Firecracker itself, in this stand-in); it ends with the machine.
	uffdGuest atomic.Pointer[uffdtest.Child]
}

var (
	_ vmm.Machine    = (*fakeMachine)(nil)
	_ vmm.CPULimiter = (*fakeMachine)(nil)
)

func (m *fakeMachine) SetCPULimit(millicores int64) error {
	m.cpu.Store(millicores)
	return nil
}

func (m *fakeMachine) ID() string                { return m.cfg.ID }
func (m *fakeMachine) PID() int                  { return m.pid }
func (m *fakeMachine) Config() vmm.MachineConfig { return m.cfg }
func (m *fakeMachine) DialAgent(context.Context) (net.Conn, error) {
	if m.d.agentAfterRestore && !m.restored.Load() {
		return nil, fmt.Errorf("fake %s: no agent channel before Restore: %w", m.cfg.ID, errdefs.ErrFailedPrecondition)
	}
	return m.host, nil
}

func (d *fakeDriver) Features() vmm.Features {
	return vmm.Features{AgentAfterRestore: d.agentAfterRestore, UffdMemory: d.uffd}
}

func (m *fakeMachine) Restore(ctx context.Context) (vmm.RestoreTimings, error) {
	n := m.d.restores.Add(1)
	if m.d.restoreDelay > 0 {
		select {
		case <-time.After(m.d.restoreDelay):
		case <-ctx.Done():
			return vmm.RestoreTimings{}, ctx.Err()
		}
	}
	if n == m.d.holdRestore {
		select {
		case <-m.d.holdGate:
		case <-ctx.Done():
			return vmm.RestoreTimings{}, ctx.Err()
		}
	}
	if n == m.d.failRestore {
		return vmm.RestoreTimings{}, fmt.Errorf("injected restore failure: %w", errdefs.ErrInternal)
	}
	if m.uffdSocket != "" {
		if err := m.readThroughPageServer(); err != nil {
			return vmm.RestoreTimings{}, err
		}
	}
	var id atomic.Value // the sandbox id of the last identity
	id.Store("")
	info := func() agentapi.Info {
		return agentapi.Info{SandboxID: id.Load().(string), AgentVersion: "fake", ProtocolVersion: agentapi.Version, Python: true}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+agentapi.PathInfo, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(info())
	})
	mux.HandleFunc("POST "+agentapi.PathIdentity, func(w http.ResponseWriter, r *http.Request) {
		var in agentapi.Identity
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if m.d.failIdentity.Load() {
			http.Error(w, "injected identity failure", http.StatusInternalServerError)
			return
		}
		id.Store(in.SandboxID)
		m.d.clock.Store(in.UnixNano)
		m.d.identities.Add(1)
		json.NewEncoder(w).Encode(info())
	})
	if m.d.rehearse != nil {
		mux.HandleFunc("POST "+agentapi.PathRehearse, func(w http.ResponseWriter, r *http.Request) {
			m.d.rehearsals.Add(1)
			m.d.rehearse(w, r)
		})
	}
	go agentconn.Serve(context.Background(), m.guest, mux, func(h agentapi.Hello) (agentapi.Info, error) {
		time.Sleep(m.d.helloDelay)
		id.Store(h.Identity.SandboxID)
		m.d.clock.Store(h.Identity.UnixNano)
		m.d.helloAnswered.Store(time.Now().UnixNano())
		return info(), nil
	})
	m.restored.Store(true)
	return vmm.RestoreTimings{}, nil
}

// readThroughPageServer has a child process map the machine's memory,
// attach it to the page server as Firecracker does, and read all of it.
func (m *fakeMachine) readThroughPageServer() error {
	child, err := uffdtest.StartChild(m.uffdSocket, m.cfg.MemoryMiB<<20)
	if err != nil {
		return err
	}
	m.uffdGuest.Store(child)
	d, err := child.Digest()
	if err != nil {
		return err
	}
	m.d.mu.Lock()
	m.d.uffdDigests = append(m.d.uffdDigests, d)
	m.d.mu.Unlock()
	return nil
}

// Snapshot writes small stand-in files; a diff layer gets an empty page
// index (no page written), enough to commit it.
func (m *fakeMachine) Snapshot(ctx context.Context, spec vmm.SnapshotSpec) (vmm.SnapshotResult, error) {
	if m.d.snapshotGate != nil {
		select {
		case <-m.d.snapshotGate:
		case <-ctx.Done():
			return vmm.SnapshotResult{}, ctx.Err()
		}
	}
	if m.d.snapshotErr != nil {
		return vmm.SnapshotResult{}, m.d.snapshotErr
	}
	if spec.Layer {
		ix := (&memlayer.Builder{PageSize: 4096, MemorySize: uint64(m.cfg.MemoryMiB) << 20}).Index()
		if err := memlayer.WriteFile(spec.PageIndexFile, ix); err != nil {
			return vmm.SnapshotResult{}, err
		}
	}
	for _, f := range []string{spec.StateFile, spec.MemoryFile} {
		if err := os.WriteFile(f, []byte("fake "+filepath.Base(f)), 0o600); err != nil {
			return vmm.SnapshotResult{}, err
		}
	}
	if m.d.afterSnapshot != nil {
		m.d.afterSnapshot()
	}
	return vmm.SnapshotResult{StateFile: spec.StateFile, MemoryFile: spec.MemoryFile, Paused: time.Millisecond}, nil
}

// exit ends the machine with err (nil: a requested stop).
func (m *fakeMachine) exit(err error) {
	m.once.Do(func() {
		m.exitErr = err
		if g := m.uffdGuest.Load(); g != nil {
			g.Close()
		}
		m.guest.Close()
		m.host.Close()
		close(m.done)
	})
}

func (m *fakeMachine) Stop(context.Context) error { m.exit(nil); return nil }
func (m *fakeMachine) Kill() error                { m.exit(nil); return nil }
func (m *fakeMachine) Done() <-chan struct{}      { return m.done }
func (m *fakeMachine) ExitError() error           { return m.exitErr }
func (m *fakeMachine) ConsoleTail(int) string     { return "fake console: kernel panic" }

var errCrash = errors.New("fake VMM crashed")
