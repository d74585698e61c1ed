package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/qmp"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// state is where a machine is in its lifecycle (see package vmm).
type state int

const (
	stateStarting  state = iota
	statePrepared        // waiting in -incoming defer
	stateRestoring       // migrate-incoming sent
	stateRunning
	stateSnapshotting
	stateExited
)

func (s state) String() string {
	return [...]string{"starting", "prepared", "restoring", "running", "snapshotting", "exited"}[s]
}

// stopTimeout bounds Stop when its context has no deadline.
const stopTimeout = 10 * time.Second

// detailBytes is how much of QEMU's stderr and the console an exit error
// quotes.
const detailBytes = 2048

// Machine is one QEMU process. It implements vmm.Machine.
type Machine struct {
	d        *Driver
	cfg      vmm.MachineConfig
	proc     process // the QEMU process: a child (started) or a pidfd (adopted)
	ident    vmm.ProcessIdentity
	incoming bool
	feat     features      // what this QEMU can do: the binary's, or the adopted process's (query-version)
	uid      int           // from the driver's uid pool, released when reaped; 0 if none
	qmp      *qmp.Client   // set once connected (under mu), before the machine is handed out
	qmpReady time.Duration // process start to QMP ready
	// stateFile is a prepared machine's state file, handed over to QEMU
	// for Restore (handover.go).
	stateFile *handover
	// memID is the file a clone's RAM maps (cfg.MemoryFile) as it was
	// when QEMU started (memIDFile keeps it for an adopting daemon); nil
	// if unknown. A branch finds the RAM's mappings by it: the path may
	// since name nothing or another file (removing a snapshot renames its
	// directory away, then deletes it; the clone maps the file still).
	memID *fileID
	// cg is the machine's cgroup (cgroup.go), nil without one; cgMemMiB
	// its memory limit.
	cg       *cgroup.Group
	cgMemMiB int64
	// adopted is set for a machine taken over from an earlier daemon,
	// until its first branch has settled what that daemon may have left
	// running (settleAdoptedMigration).
	adopted atomic.Bool

	console     *cappedLog    // the guest console, cfg.ConsoleLog (consolelog.go)
	stderr      *cappedLog    // QEMU's stdout and stderr, qemu.log
	consoleDone chan struct{} // closed when the copy into console has ended

	done    chan struct{}   // closed once the process is reaped
	exitCtx context.Context // cancelled when the process has exited
	exited  context.CancelFunc

	// mu guards the fields below.
	mu        sync.Mutex
	state     state
	requested bool   // Stop, Kill or a snapshot's quit: the exit is no error
	shutdown  string // reason of QEMU's last SHUTDOWN event
	exitErr   error
	pid       int
	events    chan struct{} // closed when watchEvents has seen the last event
}

var _ vmm.Machine = (*Machine)(nil)

// process is the QEMU process behind a Machine.
type process interface {
	// wait blocks until the process has exited and says how it ended.
	wait() error
	// kill sends SIGKILL; a process that has exited is no error.
	kill() error
}

// child is a QEMU process this daemon started: it waits for it as its
// parent and learns its exit status.
type child struct{ cmd *exec.Cmd }

func (c child) wait() error { return c.cmd.Wait() }

func (c child) kill() error {
	// os.Process signals through a pidfd: never a recycled PID.
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func newMachine(d *Driver, cfg vmm.MachineConfig, proc process, incoming bool) *Machine {
	m := &Machine{
		d: d, cfg: cfg, proc: proc, incoming: incoming, done: make(chan struct{}),
		console:     newCappedLog(cfg.ConsoleLog, consoleLogBytes),
		stderr:      newCappedLog(filepath.Join(cfg.RunDir, stderrFile), stderrLogBytes),
		consoleDone: make(chan struct{}),
	}
	if d != nil { // nil in tests of the console alone
		m.feat = d.feat
	}
	m.exitCtx, m.exited = context.WithCancel(context.Background())
	return m
}

// ID returns the machine's ID.
func (m *Machine) ID() string { return m.cfg.ID }

// Config returns the machine's configuration with defaults filled in
// (ConsoleLog, VCPUs, the resolved Accel).
func (m *Machine) Config() vmm.MachineConfig { return m.cfg }

// PID is the QEMU process ID, 0 once reaped.
func (m *Machine) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pid
}

// ProcessIdentity is the QEMU process's PID and start time, recorded so
// that a later daemon can adopt it (Driver.Adopt). It stays the same after
// the process has exited.
func (m *Machine) ProcessIdentity() vmm.ProcessIdentity { return m.ident }

// QMP is the machine's QMP session, for queries the driver does not wrap.
func (m *Machine) QMP() *qmp.Client { return m.qmp }

// StartupTime is how long QEMU took from process start to a ready QMP.
func (m *Machine) StartupTime() time.Duration { return m.qmpReady }

// Done is closed once the process has exited and been reaped.
func (m *Machine) Done() <-chan struct{} { return m.done }

// ExitError is why the process exited: nil after Stop, Kill or a
// snapshot that stopped the VM; an errdefs.ErrUnavailable-class error with
// QEMU's exit status, last shutdown reason, stderr and console tail
// otherwise. It is nil while the process runs.
func (m *Machine) ExitError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exitErr
}

// ConsoleTail returns up to n bytes from the end of the guest console,
// escaped for a terminal (vmm.EscapeConsole): the guest wrote it.
func (m *Machine) ConsoleTail(n int) string { return vmm.EscapeConsole(m.console.Tail(n)) }

func (m *Machine) setState(s state) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != stateExited {
		m.state = s
	}
}

// transition moves from one of the allowed states to next.
func (m *Machine) transition(op string, next state, from ...state) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range from {
		if m.state == f {
			m.state = next
			return nil
		}
	}
	return fmt.Errorf("qemu %s: %s while %s: %w", m.cfg.ID, op, m.state, errdefs.ErrFailedPrecondition)
}

// reap waits for the process, records why it ended and cleans up the run
// directory's sockets.
func (m *Machine) reap() {
	werr := m.proc.wait() // a started one's output is drained then
	m.stderr.Close()
	if m.uid != 0 && m.d.uids != nil {
		// The process is gone: nothing runs as that uid any more.
		m.d.uids.release(m.uid)
	}
	m.exited()
	oom := m.removeGroup()
	m.mu.Lock()
	c, events := m.qmp, m.events
	m.mu.Unlock()
	if c != nil {
		// QEMU sent its SHUTDOWN event (if any) before exiting; let the
		// watcher record it before the exit is described.
		select {
		case <-events:
		case <-time.After(time.Second):
		}
		c.Close()
	}
	for _, name := range []string{qmpSocket, agentSocket, consoleSocket, pidFile, memIDFile} {
		os.Remove(filepath.Join(m.cfg.RunDir, name))
	}
	// The console's last lines, for the exit error and ConsoleTail
	// after Done.
	select {
	case <-m.consoleDone:
	case <-time.After(stderrDrainTimeout):
	}
	m.mu.Lock()
	m.state = stateExited
	m.pid = 0
	if !m.requested {
		m.exitErr = m.describeExit(werr, oom)
	}
	exitErr, reason := m.exitErr, m.shutdown
	m.mu.Unlock()
	close(m.done)
	if exitErr != nil {
		m.d.log.Warn("vmm exited unexpectedly", "id", m.cfg.ID, "err", werr, "shutdown", reason)
	}
}

// describeExit builds the error for an exit nobody asked for; m.mu is held.
func (m *Machine) describeExit(werr error, oomKilled bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "qemu %s exited unexpectedly", m.cfg.ID)
	if werr != nil {
		fmt.Fprintf(&b, " (%v)", werr)
	} else {
		b.WriteString(" (exit status 0)")
	}
	if oomKilled {
		b.WriteString(", " + m.oomDetail())
	}
	if m.shutdown != "" {
		fmt.Fprintf(&b, ", shutdown reason %q", m.shutdown)
		if m.shutdown == "guest-reset" {
			b.WriteString(" (a guest panic resets, and -no-reboot turns the reset into an exit)")
		}
	}
	class := errdefs.ErrUnavailable
	// QEMU's output may quote the guest (or be a taken-over QEMU's).
	if s := strings.TrimSpace(vmm.EscapeConsole(m.stderr.Tail(detailBytes))); s != "" {
		fmt.Fprintf(&b, "\nqemu stderr:\n%s", s)
		if hint := m.hugePoolHint(s); hint != "" {
			fmt.Fprintf(&b, "\n%s", hint)
			class = errdefs.ErrResourceExhausted
		}
	}
	if s := strings.TrimSpace(m.ConsoleTail(detailBytes)); s != "" {
		fmt.Fprintf(&b, "\nconsole tail:\n%s", s)
	}
	return fmt.Errorf("%s: %w", b.String(), class)
}

// hugePoolHint explains QEMU's failure to map guest RAM from a memory file
// on hugetlbfs: the kernel reserves a private mapping's huge pages when it
// is made (so a clone never dies of SIGBUS on a copy-on-write later), and
// the pool had too few free. "" for any other failure.
func (m *Machine) hugePoolHint(stderr string) string {
	if m.cfg.MemoryFile == "" || !strings.Contains(stderr, "unable to map backing store for guest RAM") {
		return ""
	}
	huge, err := fsutil.HugePageSize(filepath.Dir(m.cfg.MemoryFile))
	if err != nil || huge == 0 {
		return ""
	}
	return fmt.Sprintf("the memory dir is on hugetlbfs and its huge page pool has too few free pages: each sandbox reserves its guest memory (%d MiB = %d pages of %d KiB) when it starts; raise /proc/sys/vm/nr_hugepages (HugePages_Free in /proc/meminfo says what is left), or use fewer pooled VMMs (--pool)",
		m.cfg.MemoryMiB, int64(m.cfg.MemoryMiB)<<20/huge, huge>>10)
}

// awaitExitDetail is exitDetail once the reaper has described the exit,
// for a caller that saw the process exit (exitCtx): the reaper drains
// QEMU's output and console first, each wait bounded (see reap), and the
// description quotes them.
func (m *Machine) awaitExitDetail() error {
	select {
	case <-m.done:
	case <-time.After(time.Minute):
	}
	return m.exitDetail()
}

// exitDetail is the exit error, or a description of a requested exit.
func (m *Machine) exitDetail() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exitErr != nil {
		return m.exitErr
	}
	return fmt.Errorf("qemu %s has exited: %w", m.cfg.ID, errdefs.ErrUnavailable)
}

// watchEvents records the reason of SHUTDOWN events until the QMP
// connection ends.
func (m *Machine) watchEvents(sub *qmp.Subscription, done chan<- struct{}) {
	defer close(done)
	for ev := range sub.C() {
		var data struct {
			Reason string `json:"reason"`
		}
		json.Unmarshal(ev.Data, &data)
		m.mu.Lock()
		m.shutdown = data.Reason
		m.mu.Unlock()
	}
}

// DialAgent connects to the guest agent's virtio-serial port (a unix
// socket QEMU serves, one client at a time: a second connection waits
// until the first closes). It works before Restore too.
func (m *Machine) DialAgent(ctx context.Context) (net.Conn, error) {
	path := filepath.Join(m.cfg.RunDir, agentSocket)
	select {
	case <-m.done:
		return nil, fmt.Errorf("qemu %s: dial agent: %w", m.cfg.ID, m.exitDetail())
	default:
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(m.exitCtx, func() { cancel(errExited) })
	defer stop()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		if context.Cause(ctx) == errExited {
			return nil, fmt.Errorf("qemu %s: dial agent: %w", m.cfg.ID, m.awaitExitDetail())
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("qemu %s: dial agent: %w", m.cfg.ID, context.Cause(ctx))
		}
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("qemu %s: dial agent: %w", m.cfg.ID, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Stop asks QEMU to quit and kills it if it has not exited when ctx ends
// (after 10 s if ctx has no deadline). It returns once the process is
// gone. Stopping an exited machine does nothing.
func (m *Machine) Stop(ctx context.Context) error {
	m.mu.Lock()
	m.requested = true
	m.mu.Unlock()
	select {
	case <-m.done:
		return nil
	default:
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, stopTimeout)
		defer cancel()
	}
	if err := m.qmp.Execute(ctx, "quit", nil, nil); err != nil && !errors.Is(err, qmp.ErrClosed) {
		m.Kill()
	}
	select {
	case <-m.done:
	case <-ctx.Done():
		m.d.log.Warn("vmm did not quit in time, killing it", "id", m.cfg.ID)
		m.Kill()
		<-m.done
	}
	return nil
}

// Kill ends the process with SIGKILL at once; Done closes shortly after.
// Killing an exited machine does nothing.
func (m *Machine) Kill() error {
	m.mu.Lock()
	m.requested = true
	m.mu.Unlock()
	if err := m.proc.kill(); err != nil {
		return fmt.Errorf("qemu %s: kill: %w", m.cfg.ID, err)
	}
	return nil
}
