package qemu

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/jail"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/qmp"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// startTimeout bounds QEMU's start-up to a ready QMP socket when the
// caller's context has no deadline of its own.
const startTimeout = 30 * time.Second

// errExited cancels waits on a machine whose process is gone.
var errExited = errors.New("qemu process exited")

// validate fills defaults into c and checks it.
var (
	macRule    = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
	ifnameRule = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
)

func validate(c *vmm.MachineConfig, incoming bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("qemu %s: %s: %w", c.ID, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	if c.ID == "" {
		return bad("no machine ID")
	}
	if c.RunDir == "" {
		return bad("no run directory")
	}
	if c.MemoryMiB <= 0 {
		return bad("memory %d MiB", c.MemoryMiB)
	}
	// Values that reach QEMU's option syntax unescaped must be plain: a
	// MAC or tap name with a ',' could add options (snapshots can arrive in
	// archives from elsewhere).
	if n := c.Network; n != nil {
		if n.MAC != "" && !macRule.MatchString(n.MAC) {
			return bad("guest MAC %q is not of the form 06:00:ac:1f:00:02", n.MAC)
		}
		if !ifnameRule.MatchString(n.TapName) {
			return bad("tap name %q: 1-15 letters, digits, '-', '_' or '.'", n.TapName)
		}
	}
	if c.VCPUs == 0 {
		c.VCPUs = 1
	}
	if c.VCPUs < 0 {
		return bad("%d vCPUs", c.VCPUs)
	}
	if c.Image.Kernel == "" {
		return bad("no kernel")
	}
	if c.ConsoleLog == "" {
		c.ConsoleLog = filepath.Join(c.RunDir, consoleFile)
	}
	if n := len(filepath.Join(c.RunDir, consoleSocket)); n > maxSocketPath { // the longest name
		return bad("run directory %q too long for unix sockets (%d > %d bytes)", c.RunDir, n, maxSocketPath)
	}
	if c.Network != nil && c.Network.TapName == "" {
		return bad("network without a tap name")
	}
	for what, p := range map[string]string{"kernel": c.Image.Kernel, "initrd": c.Image.Initrd, "rootfs": c.Image.Rootfs} {
		if p != "" {
			if err := checkFile(what, p); err != nil {
				return fmt.Errorf("qemu %s: %w", c.ID, err)
			}
		}
	}
	if c.MemoryFile == "" {
		return nil
	}
	st, err := os.Stat(c.MemoryFile)
	switch {
	case incoming && err != nil:
		if os.IsNotExist(err) {
			return fmt.Errorf("qemu %s: memory file %s: %w", c.ID, c.MemoryFile, errdefs.ErrNotFound)
		}
		return fmt.Errorf("qemu %s: memory file: %w", c.ID, err)
	case incoming && st.Size() != int64(c.MemoryMiB)<<20:
		// QEMU would refuse a smaller file and grow an empty one: the
		// template's image must never change.
		return bad("memory file %s is %d bytes, want %d MiB", c.MemoryFile, st.Size(), c.MemoryMiB)
	case !incoming && err == nil && st.Size() != 0:
		return fmt.Errorf("qemu %s: memory file %s exists: %w", c.ID, c.MemoryFile, errdefs.ErrAlreadyExists)
	}
	return nil
}

// start launches QEMU for Boot (stateFile == "") or Prepare.
func (d *Driver) start(ctx context.Context, cfg vmm.MachineConfig, stateFile string) (_ *Machine, err error) {
	began := time.Now()
	incoming := stateFile != ""
	if err := validate(&cfg, incoming); err != nil {
		return nil, err
	}
	if incoming {
		if err := checkFile("state file", stateFile); err != nil {
			return nil, fmt.Errorf("qemu %s: %w", cfg.ID, err)
		}
		// Clones never boot: give QEMU a header-only kernel so it does not
		// hold the whole bzImage in memory (see restoreKernel).
		stub, err := restoreKernel(filepath.Join(filepath.Dir(cfg.RunDir), ".restore-kernels"), cfg.Image.Kernel)
		if err != nil {
			return nil, fmt.Errorf("qemu %s: %w", cfg.ID, err)
		}
		cfg.Image.Kernel = stub
	}
	accel, err := d.Accel(cfg.Accel)
	if err != nil {
		return nil, fmt.Errorf("qemu %s: %w", cfg.ID, err)
	}
	cfg.Accel = accel
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}

	var undo cleanup.Stack
	defer func() {
		if err != nil {
			undo.Clean(ctx)
		}
	}()
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu %s: %w", cfg.ID, err)
	}
	for _, name := range []string{qmpSocket, agentSocket, consoleSocket, pidFile, memIDFile} {
		os.Remove(filepath.Join(cfg.RunDir, name))
	}
	if cfg.MemoryFile != "" && !incoming {
		// Created here (QEMU sizes it) so that a failed start removes
		// what it made; an empty file the caller made is left alone.
		f, err := os.OpenFile(cfg.MemoryFile, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		switch {
		case err == nil:
			f.Close()
			undo.Push(func(context.Context) error { return os.Remove(cfg.MemoryFile) })
		case !errors.Is(err, os.ErrExist):
			return nil, fmt.Errorf("qemu %s: memory file: %w", cfg.ID, err)
		}
	}
	conLn, conConn, err := listenConsole(filepath.Join(cfg.RunDir, consoleSocket))
	if err != nil {
		return nil, fmt.Errorf("qemu %s: console socket: %w", cfg.ID, err)
	}
	undo.Push(func(context.Context) error { return os.Remove(filepath.Join(cfg.RunDir, consoleSocket)) })
	defer conLn.Close() // QEMU has its own copy once started
	defer func() {
		if conConn != nil {
			conConn.Close() // not handed to followConsole
		}
	}()

	l := &launch{cfg: cfg, accel: accel, cpu: d.cfg.CPU, incoming: incoming, runAs: d.cfg.RunAs, feat: d.feat}
	var uid int
	if d.uids != nil {
		if uid, err = d.uids.take(); err != nil {
			return nil, fmt.Errorf("qemu %s: %w", cfg.ID, err)
		}
		// Held until the reaper sees the process exit (or the spawn fails).
		l.runAs, l.uid = fmt.Sprintf("%d:%d", uid, uid), uid
	}
	if l.cpu == "" {
		l.cpu = "max"
		if accel == vmm.AccelKVM {
			l.cpu = "host"
		}
	}
	if accel == vmm.AccelTCG {
		l.tbSize = d.cfg.TBSizeMiB
		l.tscKHz = d.tscKHz()
	}

	cmd := exec.Command(d.binary, l.args()...)
	m := newMachine(d, cfg, child{cmd}, incoming)
	// One pipe for both (the same Writer), copied into the capped
	// qemu.log; Wait returns once it is drained, so an exit error has
	// QEMU's last words. WaitDelay bounds that if something else held
	// the pipe open.
	cmd.Stdout = m.stderr
	cmd.Stderr = m.stderr
	cmd.WaitDelay = stderrDrainTimeout
	cmd.ExtraFiles = []*os.File{conLn} // consoleFD
	cmd.Dir = cfg.RunDir
	// Own process group: a Ctrl-C at the daemon's terminal is not the
	// VMMs' business.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if d.cfg.KillOnParentDeath {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	grp, err := d.newGroup(ctx, l)
	if err != nil {
		if uid != 0 {
			d.uids.release(uid)
		}
		return nil, err
	}
	if grp != nil {
		// Until the reaper owns it (below).
		undo.Push(func(ctx context.Context) error { return grp.Delete(ctx, true) })
		m.cg, m.cgMemMiB = grp, vmmLimits(l).MemoryBytes>>20
	}
	if d.cfg.Jail {
		spec := jailSpec(l, d.binary)
		if grp != nil {
			spec.Cgroups = grp.Dirs()
		}
		if err := os.MkdirAll(spec.Root, 0o700); err != nil {
			return nil, fmt.Errorf("qemu %s: jail: %w", cfg.ID, err)
		}
		if err := jail.Wrap(cmd, spec, d.jailHelper); err != nil {
			return nil, fmt.Errorf("qemu %s: %w", cfg.ID, err)
		}
	}
	m.uid = uid
	if incoming && cfg.MemoryFile != "" {
		m.memID = recordMemID(cfg)
	}
	if err := d.spawn(cmd, cfg.Network, grp); err != nil {
		if uid != 0 {
			d.uids.release(uid)
		}
		return nil, fmt.Errorf("qemu %s: start %s: %w", cfg.ID, d.binary, err)
	}
	spawned := time.Now()
	m.followConsole(conConn)
	conConn = nil
	m.pid = cmd.Process.Pid // before the reaper runs, which zeroes it
	if cfg.Nice != 0 {
		// Right after the fork, before QEMU creates its threads (which
		// inherit the main thread's niceness).
		if err := unix.Setpriority(unix.PRIO_PROCESS, m.pid, cfg.Nice); err != nil {
			d.log.Warn("could not lower the VMM's CPU priority", "id", cfg.ID, "err", err)
		}
	}
	// Read while the unreaped child holds its PID: the identity a later
	// daemon verifies before adopting it.
	m.ident = vmm.ProcessIdentity{PID: m.pid}
	if st, err := procfs.ReadStat(m.pid); err == nil {
		m.ident.StartTime = st.StartTime
	} else {
		d.log.Warn("vmm start time unknown; a later daemon cannot adopt it", "id", cfg.ID, "err", err)
	}
	go m.reap()
	undo.Push(func(ctx context.Context) error {
		m.Kill()
		<-m.done
		return nil
	})
	os.WriteFile(filepath.Join(cfg.RunDir, pidFile), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)

	if err := m.connect(ctx); err != nil {
		return nil, err
	}
	m.qmpReady = time.Since(spawned)
	// x-ignore-shared: a shared, file-backed RAM block is neither sent
	// (template) nor expected (clone). Set before it matters, off the
	// restore's critical path.
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
	if err := m.qmp.Execute(ctx, "migrate-set-capabilities", caps, nil); err != nil {
		return nil, m.failure("set migration capabilities", err)
	}
	if incoming {
		// Restore loads it, and takes it back from QEMU.
		if m.stateFile, err = m.handOverFile(ctx, stateFile, os.O_RDONLY, stateFD); err != nil {
			return nil, m.failure("hand over state file", err)
		}
	}
	if incoming {
		m.setState(statePrepared)
	} else {
		m.setState(stateRunning)
	}
	d.log.Debug("vmm started", "id", cfg.ID, "pid", cmd.Process.Pid, "accel", accel,
		"incoming", incoming, "qmp_ready", m.qmpReady, "total", time.Since(began))
	undo.Release()
	return m, nil
}

// spawn starts cmd, inside the network namespace when there is one, and
// in grp unless the jail puts it there (Config.Jail).
func (d *Driver) spawn(cmd *exec.Cmd, n *vmm.Network, grp *cgroup.Group) error {
	// Started from a thread switched into the namespace: the fork
	// inherits it. See netns.DoPath for how the thread is restored.
	var inNS func(func() error) error
	if n != nil && n.NetNSPath != "" {
		inNS = func(f func() error) error { return netns.DoPath(n.NetNSPath, f) }
	}
	if grp != nil && !d.cfg.Jail {
		return grp.Start(cmd, inNS)
	}
	if inNS == nil {
		return cmd.Start()
	}
	return inNS(cmd.Start)
}

// connect dials QMP, giving up when the process exits.
func (m *Machine) connect(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(m.exitCtx, func() { cancel(errExited) })
	defer stop()
	c, err := qmp.Dial(ctx, filepath.Join(m.cfg.RunDir, qmpSocket))
	if err != nil {
		return m.failure("connect QMP", err)
	}
	m.attach(c)
	return nil
}

// attach makes c the machine's QMP session and starts recording the
// reasons of SHUTDOWN events.
func (m *Machine) attach(c *qmp.Client) {
	events := make(chan struct{})
	sub := c.SubscribeNames("SHUTDOWN")
	m.mu.Lock()
	m.qmp, m.events = c, events
	m.mu.Unlock()
	go m.watchEvents(sub, events)
}

// failure describes a failed step, with QEMU's own words if it exited.
//
// The reaper describes an exit only after draining QEMU's output and
// console (bounded, see reap), which takes a moment on a loaded host; a
// step that failed because QEMU is dying (a QMP connection reset) waits
// for that description rather than return its own error without QEMU's
// words (e.g. the hint for a full huge page pool).
func (m *Machine) failure(step string, err error) error {
	if m.exitCtx.Err() != nil {
		return fmt.Errorf("qemu %s: %s: %w", m.cfg.ID, step, m.awaitExitDetail())
	}
	// A failure of the caller's context is no sign of an exit: a short
	// look only. Anything else most likely is one.
	look := exitLook
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		look = 50 * time.Millisecond
	}
	deadline := time.Now().Add(look)
	for {
		select {
		case <-m.done:
			return fmt.Errorf("qemu %s: %s: %w", m.cfg.ID, step, m.exitDetail())
		case <-time.After(10 * time.Millisecond):
		}
		if m.processEnded() {
			return fmt.Errorf("qemu %s: %s: %w", m.cfg.ID, step, m.awaitExitDetail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu %s: %s: %w", m.cfg.ID, step, err)
		}
	}
}

// exitLook is how long a failed step looks for QEMU exiting before it
// reports its own error (QEMU still running).
const exitLook = 2 * time.Second

// processEnded reports whether QEMU's process has ended: reaped, or a
// zombie the reaper has not collected yet.
func (m *Machine) processEnded() bool {
	m.mu.Lock()
	pid := m.pid
	m.mu.Unlock()
	if pid == 0 {
		return true
	}
	st, err := procfs.ReadStat(pid)
	return err != nil || st.Exited()
}
