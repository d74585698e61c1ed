package fakevmm

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Machine is a handle on a fake machine (see the package doc). Adopting
// a machine makes a second handle on it.
type Machine struct {
	v *vm
}

// ID is the machine's MachineConfig.ID.
func (m *Machine) ID() string { return m.v.cfg.ID }

// PID is the test process's own PID while the machine runs (there is no
// VMM process: never signal it), 0 once it has exited.
func (m *Machine) PID() int {
	select {
	case <-m.v.done:
		return 0
	default:
		return m.v.ident.PID
	}
}

// Config is the configuration the machine was started with.
func (m *Machine) Config() vmm.MachineConfig { return m.v.cfg }

// ProcessIdentity is the PID and a serial number unique to the machine,
// for Driver.Adopt; it stays the same after the machine has exited.
func (m *Machine) ProcessIdentity() vmm.ProcessIdentity { return m.v.ident }

// DialAgent opens the agent channel, an in-process net.Pipe; a new one
// closes the previous one. Lines sent before Restore are answered once
// the guest runs.
func (m *Machine) DialAgent(ctx context.Context) (net.Conn, error) { return m.v.dialAgent() }

// Detach lets go of the machine as a dying daemon does: the agent channel
// closes and the machine runs on, for a new Driver to adopt.
func (m *Machine) Detach() {
	m.v.mu.Lock()
	defer m.v.mu.Unlock()
	if m.v.agent != nil {
		m.v.agent.Close()
		m.v.agent = nil
	}
}

// Restore loads the state file given to Prepare, maps the memory file
// private (copy-on-write) and lets the guest run. A missing state file
// fails with an errdefs.ErrNotFound-class error, a corrupt one, or one
// that does not fit the machine, with errdefs.ErrInvalidArgument; on
// failure the machine is ended (ExitError says why).
func (m *Machine) Restore(ctx context.Context) (_ vmm.RestoreTimings, err error) {
	v := m.v
	start := time.Now()
	v.ctl.Lock()
	defer v.ctl.Unlock()
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if st != statePrepared {
		return vmm.RestoreTimings{}, fmt.Errorf("fakevmm %s: restore: the machine is %s, not prepared: %w", v.cfg.ID, st, errdefs.ErrFailedPrecondition)
	}
	defer func() {
		if err != nil {
			v.exit(err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return vmm.RestoreTimings{}, fmt.Errorf("fakevmm %s: restore: %w", v.cfg.ID, context.Cause(ctx))
	}
	size := memBytes(v.cfg)
	if err := readState(v.stateFile, v.cfg, size); err != nil {
		return vmm.RestoreTimings{}, fmt.Errorf("fakevmm %s: restore: %w", v.cfg.ID, err)
	}
	f, err := openMemoryFile(v.cfg.MemoryFile, size)
	if err != nil {
		return vmm.RestoreTimings{}, fmt.Errorf("fakevmm %s: restore: %w", v.cfg.ID, err)
	}
	if err := v.setMemory(f, size, false); err != nil {
		f.Close()
		return vmm.RestoreTimings{}, fmt.Errorf("fakevmm %s: restore: %w", v.cfg.ID, err)
	}
	load := time.Since(start)
	v.log("fakevmm: restored from %s", v.stateFile)
	v.run()
	return vmm.RestoreTimings{Load: load, Total: time.Since(start)}, nil
}

// Pause stops the guest between two commands; idempotent.
func (m *Machine) Pause(ctx context.Context) error {
	m.v.ctl.Lock()
	defer m.v.ctl.Unlock()
	prev, err := m.v.stopVCPU("pause")
	if err == nil && prev == stateRunning {
		m.v.log("fakevmm: paused")
	}
	return err
}

// Resume lets a paused guest run again; idempotent.
func (m *Machine) Resume(ctx context.Context) error {
	v := m.v
	v.ctl.Lock()
	defer v.ctl.Unlock()
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if st != stateRunning && st != statePaused {
		return fmt.Errorf("fakevmm %s: resume: the machine is %s, not running: %w", v.cfg.ID, st, errdefs.ErrFailedPrecondition)
	}
	v.run()
	return nil
}

// Stop ends the machine as a guest shutdown would: ExitError stays nil.
func (m *Machine) Stop(ctx context.Context) error {
	m.v.exit(nil)
	return nil
}

// Kill ends the machine at once (once a snapshot writing its memory has
// finished); ExitError stays nil. Killing an exited machine does nothing.
func (m *Machine) Kill() error {
	m.v.exit(nil)
	return nil
}

// Done is closed once the machine has exited.
func (m *Machine) Done() <-chan struct{} { return m.v.done }

// ExitError is nil after Stop, Kill or a snapshot with StopAfter, and
// the failure after a failed Restore.
func (m *Machine) ExitError() error {
	m.v.mu.Lock()
	defer m.v.mu.Unlock()
	return m.v.exitErr
}

// ConsoleTail is up to n bytes from the end of the console: the fake
// VMM's own lifecycle messages.
func (m *Machine) ConsoleTail(n int) string {
	m.v.mu.Lock()
	defer m.v.mu.Unlock()
	c := m.v.console
	if n < len(c) {
		c = c[len(c)-n:]
	}
	return vmm.EscapeConsole(string(c))
}

// openMemoryFile opens a snapshot's memory file for a private mapping,
// checking that it holds size bytes: touching a mapping beyond the end
// of its file would crash the test process.
func openMemoryFile(path string, size int64) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("memory file: %w: %w", err, notFoundOr(err, errdefs.ErrInvalidArgument))
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < size {
		err = fmt.Errorf("memory file %s holds %d bytes, the machine has %d; restore with the snapshotted machine's MemoryMiB: %w",
			path, fi.Size(), size, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
