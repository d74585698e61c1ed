package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/qmp"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Adoption: a QEMU started by this driver does not depend on the daemon
// that started it. It runs in its own process group, it ignores SIGPIPE
// (QEMU does so itself) so the daemon's half of QMP, of the agent and
// console sockets and of its stdout and stderr pipe going away only ends
// those sessions (its later output is lost, see consolelog.go), and it
// gets no parent-death signal unless Config.KillOnParentDeath asks for
// one. QEMU's QMP, agent and console sockets are servers (server=on): once
// the old daemon's connections are gone, they accept a new client. A later
// daemon can therefore take the process over with Adopt.

// adoptTimeout bounds Adopt when the caller's context has no deadline.
const adoptTimeout = 10 * time.Second

// Adopt takes over a QEMU process that an earlier daemon started with this
// driver and left running (see vmm.Adopter). It checks that spec.Process is
// still alive and is the recorded process (PID and start time, and a command
// line naming the machine's ID and run directory), holds it by a pidfd,
// reconnects QMP and checks that the guest runs. A guest that an earlier
// daemon left paused in a snapshot is resumed (QMP cont).
//
// A process that is the recorded QEMU but whose QMP does not answer within
// 10 s, or whose guest is in any other state (a prepared machine waiting
// for a restore, a guest that shut down), is killed, and Adopt fails with
// errdefs.ErrUnavailable: nothing runs on that no daemon accounts for.
// When ctx ends first, the process is left running for a later attempt.
//
// The adopted machine behaves as a started one: DialAgent, Snapshot, Stop,
// Kill (pidfd_send_signal), Done and ConsoleTail. As the daemon is not the
// process's parent, ExitError cannot give the exit status except when it
// could still be read from the exited (zombie) process.
func (d *Driver) Adopt(ctx context.Context, spec vmm.AdoptSpec) (vmm.Machine, error) {
	began := time.Now()
	cfg, want := spec.MachineConfig, spec.Process
	if cfg.ID == "" || cfg.RunDir == "" || want.PID <= 0 || want.StartTime == 0 {
		return nil, fmt.Errorf("qemu adopt %q: need an ID, a run directory, a PID and a start time (got %q, pid %d, start %d): %w",
			cfg.ID, cfg.RunDir, want.PID, want.StartTime, errdefs.ErrInvalidArgument)
	}
	if cfg.ConsoleLog == "" {
		cfg.ConsoleLog = filepath.Join(cfg.RunDir, consoleFile)
	}
	proc, incoming, err := openAdoptee(ctx, cfg, want)
	if err != nil {
		return nil, err
	}
	c, status, err := takeOverQMP(ctx, cfg)
	if err != nil {
		fail := func(format string, args ...any) error {
			return fmt.Errorf("qemu %s: adopt pid %d: %w; %s", cfg.ID, want.PID, err, fmt.Sprintf(format, args...))
		}
		switch {
		case proc.exited():
			proc.f.Close()
			return nil, fmt.Errorf("%w: %w", fail("the process exited meanwhile"), errdefs.ErrNotFound)
		case ctx.Err() != nil:
			proc.f.Close()
			return nil, fmt.Errorf("%w: %w", fail("left it running"), context.Cause(ctx))
		}
		kerr := proc.kill()
		proc.f.Close()
		if kerr != nil {
			return nil, fmt.Errorf("%w: %w", fail("killing it failed too: %v", kerr), errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("%w: %w", fail("killed it"), errdefs.ErrUnavailable)
	}
	m := newMachine(d, cfg, proc, incoming)
	m.pid, m.ident = want.PID, want
	m.adopted.Store(true)
	// Its cgroup, if the earlier daemon made one: removed when it exits.
	if g := d.openGroup(cfg); g != nil {
		m.cg = g
		if l, err := g.Limits(); err == nil {
			m.cgMemMiB = l.MemoryBytes >> 20
		}
	}
	if incoming && cfg.MemoryFile != "" {
		m.memID = loadMemID(cfg)
	}
	if d.uids != nil {
		// The uid it dropped to stays taken while it runs.
		if uid, err := procUID(want.PID); err == nil && d.uids.r.Contains(uid) {
			d.uids.mark(uid)
			m.uid = uid
		}
	}
	m.state = stateRunning
	m.attach(c)
	m.settleHandovers(ctx)
	m.followConsole(reconnectConsole(cfg, d))
	go m.reap()
	if status != "running" {
		d.log.Warn("adopted vmm was paused (its daemon died during a snapshot); resumed it", "id", cfg.ID, "status", status)
	}
	d.log.Info("vmm adopted", "id", cfg.ID, "pid", want.PID, "took", time.Since(began))
	return m, nil
}

// settleHandovers learns what the adopted QEMU can do from the process
// itself, then takes back the migration files an earlier daemon that died
// mid-hand-over left with it. Neither is fatal: a QEMU of unknown version
// gets what QEMU 7.2 can do, which every release accepts.
func (m *Machine) settleHandovers(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	v, err := runningVersion(ctx, m.qmp)
	if err != nil {
		m.d.log.Warn("adopted vmm: QEMU version unknown; using only what QEMU 7.2 can do", "id", m.cfg.ID, "err", err)
	}
	m.feat = featuresOf(v)
	if v != "" && v != m.d.version {
		m.d.log.Info("adopted vmm runs another QEMU than the binary installed", "id", m.cfg.ID, "running", v, "installed", m.d.version)
	}
	if err := m.dropStrayHandovers(ctx); err != nil {
		m.d.log.Warn("adopted vmm: could not take back the migration files an earlier daemon left with QEMU", "id", m.cfg.ID, "err", err)
	}
}

// reconnectConsole connects to an adopted QEMU's console socket, which it
// serves to one client at a time (consolelog.go); nil if it has none.
func reconnectConsole(cfg vmm.MachineConfig, d *Driver) net.Conn {
	conn, err := net.DialTimeout("unix", filepath.Join(cfg.RunDir, consoleSocket), adoptTimeout)
	switch {
	case errors.Is(err, syscall.ENOENT):
		// Started by an older forkd, whose QEMU writes console.log itself.
		return nil
	case err != nil:
		d.log.Warn("adopted vmm: its console is not kept from now on", "id", cfg.ID, "err", err)
		return nil
	}
	return conn
}

// takeOverQMP connects to an adopted QEMU's QMP socket (it accepts a new
// client once the earlier daemon's connection is gone) and checks, or
// restores, that the guest runs. It returns the status found.
func takeOverQMP(ctx context.Context, cfg vmm.MachineConfig) (_ *qmp.Client, status string, err error) {
	ctx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	c, err := qmp.Dial(ctx, filepath.Join(cfg.RunDir, qmpSocket))
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	var st struct {
		Status string `json:"status"`
	}
	if err := c.Execute(ctx, "query-status", nil, &st); err != nil {
		return nil, "", err
	}
	switch st.Status {
	case "running":
	case "paused", "postmigrate":
		// Left by a daemon that died during a snapshot, before resuming
		// the guest (a snapshot that stops the VM would have quit it).
		if err := c.Execute(ctx, "cont", nil, nil); err != nil {
			return nil, "", err
		}
	default:
		return nil, "", fmt.Errorf("the guest is %q, not running", st.Status)
	}
	return c, st.Status, nil
}

// openAdoptee checks that want is alive and is cfg's QEMU, and returns it
// held by a pidfd, and whether it was started for a restore (-incoming).
func openAdoptee(ctx context.Context, cfg vmm.MachineConfig, want vmm.ProcessIdentity) (_ *adopted, incoming bool, err error) {
	notFound := func(format string, args ...any) error {
		return fmt.Errorf("qemu %s: adopt pid %d: %s: %w", cfg.ID, want.PID, fmt.Sprintf(format, args...), errdefs.ErrNotFound)
	}
	fd, err := unix.PidfdOpen(want.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, false, notFound("no such process")
	}
	if err != nil {
		return nil, false, fmt.Errorf("qemu %s: adopt pid %d: pidfd_open: %w", cfg.ID, want.PID, err)
	}
	// Non-blocking, so the runtime's poller waits for the exit (no thread
	// blocked per adopted machine).
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(want.PID))
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	st, err := procfs.ReadStat(want.PID)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return nil, false, notFound("no such process")
		}
		return nil, false, fmt.Errorf("qemu %s: adopt pid %d: %w", cfg.ID, want.PID, err)
	}
	if st.StartTime != want.StartTime {
		return nil, false, notFound("the PID now belongs to another process (started at clock tick %d, the VMM at %d)", st.StartTime, want.StartTime)
	}
	if st.Exited() {
		return nil, false, notFound("the process has exited")
	}
	// A process still in execve (just started) reads as an empty command
	// line for a moment: not yet known, rather than another process.
	args, err := procfs.WaitCmdline(ctx, want.PID)
	if err != nil {
		return nil, false, notFound("reading its command line: %v", err)
	}
	if !isVMMOf(args, cfg) {
		name := "?"
		if len(args) > 0 {
			name = filepath.Base(args[0])
		}
		return nil, false, notFound("process %q is not the QEMU of this machine (its command line names neither forkd-%s nor %s)", name, cfg.ID, cfg.RunDir)
	}
	// The pidfd was opened before the reads above: if the process it
	// refers to is still alive now, it held the PID all along, so the reads
	// described it and not a successor.
	if err := unix.PidfdSendSignal(fd, 0, nil, 0); err != nil {
		return nil, false, notFound("the process has exited")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, false, fmt.Errorf("qemu %s: adopt pid %d: %w", cfg.ID, want.PID, err)
	}
	return &adopted{f: f, rc: rc, ident: want}, slices.Contains(args, "-incoming"), nil
}

// isVMMOf reports whether a command line is the QEMU that start launches
// for cfg: named forkd-ID, with its QMP socket in cfg.RunDir.
func isVMMOf(args []string, cfg vmm.MachineConfig) bool {
	i := slices.Index(args, "-name")
	if i < 0 || i+1 >= len(args) || args[i+1] != "forkd-"+cfg.ID {
		return false
	}
	qmpArg := "unix:" + optEscape(filepath.Join(cfg.RunDir, qmpSocket)) + ","
	return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, qmpArg) })
}

// adopted is a QEMU process held by a pidfd: the daemon is not its parent,
// so it can watch for the exit and signal it, but not collect its status.
type adopted struct {
	f     *os.File // the pidfd, registered with the runtime's poller
	rc    syscall.RawConn
	ident vmm.ProcessIdentity
}

// errAdoptedExit describes the exit of an adopted process whose status is
// unknown.
var errAdoptedExit = errors.New("exited while adopted from an earlier daemon; its exit status is known only to its parent")

// wait blocks until the pidfd reports the exit, then closes it.
func (a *adopted) wait() error {
	if err := a.rc.Read(func(fd uintptr) bool { return pidfdReady(fd, 0) }); err != nil {
		// Not registered with the poller: block a thread instead.
		a.rc.Control(func(fd uintptr) {
			for !pidfdReady(fd, -1) {
			}
		})
	}
	a.f.Close()
	// Until its new parent (init or a subreaper) reaps it, the exited
	// process's status can be read: better than nothing.
	if st, err := procfs.ReadStat(a.ident.PID); err == nil && st.StartTime == a.ident.StartTime && st.State == 'Z' && st.ExitCode >= 0 {
		return fmt.Errorf("%s, read from the exited process (adopted from an earlier daemon)", waitStatusString(syscall.WaitStatus(st.ExitCode)))
	}
	return errAdoptedExit
}

// exited reports whether the process has exited. (Not through f.Fd,
// which would take the pidfd off the poller.)
func (a *adopted) exited() bool {
	done := false
	a.rc.Control(func(fd uintptr) { done = pidfdReady(fd, 0) })
	return done
}

// kill sends SIGKILL through the pidfd: never to a recycled PID.
func (a *adopted) kill() error {
	var serr error
	err := a.rc.Control(func(fd uintptr) {
		serr = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0)
	})
	if err != nil || errors.Is(serr, unix.ESRCH) {
		return nil // exited: wait has closed the pidfd, or is about to
	}
	return serr
}

// pidfdReady polls a pidfd for the process's exit for up to timeoutMS
// (-1: no limit).
func pidfdReady(fd uintptr, timeoutMS int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, timeoutMS)
	return err == nil && n > 0 && p[0].Revents != 0
}

// waitStatusString matches os.ProcessState's wording ("exit status 1",
// "signal: killed").
func waitStatusString(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}
