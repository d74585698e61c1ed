package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmlinux"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// state is where a machine is in its lifecycle (see package vmm).
type state int

const (
	stateStarted  state = iota // process up, not configured
	statePrepared              // waiting for Restore
	stateRunning
	statePaused
	stateExited
)

func (s state) String() string {
	return [...]string{"started", "prepared", "running", "paused", "exited"}[s]
}

// stopTimeout bounds Stop when its context has no deadline.
const stopTimeout = 10 * time.Second

// Machine is one Firecracker process. It implements vmm.Machine.
type Machine struct {
	d       *Driver
	cfg     vmm.MachineConfig
	root    string           // the jail's root; "" without the jailer
	api     *client          // set once the API socket answers
	restore *vmm.PrepareSpec // what Restore loads; nil for a booted machine
	// dirty accumulates a restored machine's diffs (dirty.go); set
	// by its first diff snapshot.
	dirty   *dirtySet
	cmd     *exec.Cmd
	console *cappedLog
	done    chan struct{} // closed once the process is reaped

	// mu guards the fields below.
	mu        sync.Mutex
	state     state
	requested bool // Stop, Kill or StopAfter: the exit is no error
	fullTaken bool // a Full snapshot of a restored machine (dirtyLost)
	exitErr   error
	pid       int
}

var _ vmm.Machine = (*Machine)(nil)

func newMachine(d *Driver, cfg vmm.MachineConfig) *Machine {
	return &Machine{d: d, cfg: cfg, done: make(chan struct{})}
}

// attach takes over a started process and reaps it in the background.
func (m *Machine) attach(cmd *exec.Cmd, console *cappedLog) {
	m.cmd, m.console, m.pid = cmd, console, cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		console.Close()
		m.mu.Lock()
		if !m.requested && err == nil {
			err = errors.New("the VMM exited on its own")
		}
		if m.requested {
			err = nil
		}
		if err != nil {
			m.exitErr = fmt.Errorf("firecracker %s: %w: %w", m.cfg.ID, err, errdefs.ErrUnavailable)
		}
		m.state, m.pid = stateExited, 0
		m.mu.Unlock()
		if m.api != nil {
			m.api.close()
		}
		if m.root != "" {
			// The jail's root holds links and sockets only.
			os.RemoveAll(filepath.Dir(m.root))
		}
		close(m.done)
	}()
}

func (m *Machine) ID() string                { return m.cfg.ID }
func (m *Machine) Config() vmm.MachineConfig { return m.cfg }
func (m *Machine) Done() <-chan struct{}     { return m.done }
func (m *Machine) ConsoleTail(n int) string  { return tailFile(m.consolePath(), n) }
func (m *Machine) setState(s state)          { m.mu.Lock(); m.state = s; m.mu.Unlock() }
func (m *Machine) PID() int                  { m.mu.Lock(); defer m.mu.Unlock(); return m.pid }
func (m *Machine) ExitError() error          { m.mu.Lock(); defer m.mu.Unlock(); return m.exitErr }
func (m *Machine) getState() state           { m.mu.Lock(); defer m.mu.Unlock(); return m.state }

// exitDetail is the end of Firecracker's own log, for an error of a
// machine whose VMM failed.
func (m *Machine) exitDetail() string {
	b, err := os.ReadFile(filepath.Join(m.cfg.RunDir, stderrLogName))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 1024 {
		b = b[len(b)-1024:]
	}
	return "; firecracker said: " + vmm.EscapeConsole(strings.TrimSpace(string(b)))
}

// bootArgs is the kernel command line: serial console, reboot ends the
// VMM (Firecracker has no reset), no PCI probing.
const bootArgs = "console=ttyS0 reboot=k panic=1 pci=off"

// boot configures a fresh process and starts the guest.
func (m *Machine) boot(ctx context.Context) error {
	img := m.cfg.Image
	// Firecracker on x86_64 boots an ELF vmlinux; images hold the
	// bzImage Debian ships, extracted once beside it.
	elfKernel, err := vmlinux.Ensure(img.Kernel)
	if err != nil {
		return fmt.Errorf("firecracker %s: kernel: %w", m.cfg.ID, err)
	}
	kernel, err := m.stage(elfKernel, "vmlinux")
	if err != nil {
		return err
	}
	bs := bootSource{KernelImagePath: kernel, BootArgs: strings.Join(append([]string{bootArgs}, img.KernelArgs...), " ")}
	if img.Initrd != "" {
		if bs.InitrdPath, err = m.stage(img.Initrd, "initrd"); err != nil {
			return err
		}
	}
	rootfs, err := m.stage(img.Rootfs, "rootfs.ext4")
	if err != nil {
		return err
	}
	// The agent in the initramfs mounts the first disk itself: it is no
	// kernel root device.
	root := drive{DriveID: "rootfs", PathOnHost: rootfs, IsReadOnly: true, RateLimiter: diskLimiter(m.cfg.DiskRead)}
	if err := m.api.put(ctx, "/machine-config", machineConfig{VCPUCount: m.cfg.VCPUs, MemSizeMiB: m.cfg.MemoryMiB, TrackDirtyPages: m.cfg.TrackDirtyPages}); err != nil {
		return err
	}
	if err := m.api.put(ctx, "/boot-source", bs); err != nil {
		return err
	}
	if err := m.api.put(ctx, "/drives/rootfs", root); err != nil {
		return err
	}
	if m.d.cfg.LayerMiB > 0 {
		if err := m.createLayer(); err != nil {
			return err
		}
		if err := m.api.put(ctx, "/drives/"+layerDrive, drive{DriveID: layerDrive, PathOnHost: m.inner(layerName)}); err != nil {
			return err
		}
	}
	if n := m.cfg.Network; n != nil {
		if err := m.api.put(ctx, "/network-interfaces/"+ifaceID, networkInterface{IfaceID: ifaceID, HostDevName: n.TapName, GuestMAC: n.MAC}); err != nil {
			return err
		}
	}
	if err := m.api.put(ctx, "/vsock", vsock{GuestCID: 3, UDSPath: m.inner(vsockName)}); err != nil {
		return err
	}
	if err := m.api.put(ctx, "/entropy", entropyDevice{}); err != nil {
		return err
	}
	if err := m.api.put(ctx, "/actions", instanceAction{ActionType: "InstanceStart"}); err != nil {
		return err
	}
	m.setState(stateRunning)
	return nil
}

// ifaceID is the guest NIC's id; every child keeps it (network_overrides
// names it).
const ifaceID = "eth0"

// diskLimiter turns a rate into Firecracker's token buckets (refilled
// every second); nil for no limit.
func diskLimiter(r vmm.RateLimit) *rateLimiter {
	if r.BytesPerSec <= 0 && r.OpsPerSec <= 0 {
		return nil
	}
	l := &rateLimiter{}
	if r.BytesPerSec > 0 {
		l.Bandwidth = &tokenBucket{Size: r.BytesPerSec, RefillTime: 1000}
	}
	if r.OpsPerSec > 0 {
		l.Ops = &tokenBucket{Size: r.OpsPerSec, RefillTime: 1000}
	}
	return l
}

// DialAgent connects to the guest agent over Firecracker's hybrid vsock:
// the host end of the vsock device is a Unix socket, and a connection
// asks for a guest port with "CONNECT <port>\n" and is answered
// "OK <host port>\n". The socket exists once the guest runs (after Boot,
// or Restore).
func (m *Machine) DialAgent(ctx context.Context) (net.Conn, error) {
	switch s := m.getState(); s {
	case stateRunning, statePaused:
	default:
		return nil, fmt.Errorf("firecracker %s: dial the agent: the machine is %s; the vsock device exists once the guest runs (after Boot or Restore): %w", m.cfg.ID, s, errdefs.ErrFailedPrecondition)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", m.hostPath("/"+vsockName))
	if err != nil {
		return nil, fmt.Errorf("firecracker %s: the vsock socket: %v: %w", m.cfg.ID, err, errdefs.ErrUnavailable)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", AgentVsockPort); err != nil {
		c.Close()
		return nil, fmt.Errorf("firecracker %s: vsock CONNECT: %v: %w", m.cfg.ID, err, errdefs.ErrUnavailable)
	}
	line, err := readLine(c, 32)
	if err != nil || !strings.HasPrefix(line, "OK ") {
		c.Close()
		return nil, fmt.Errorf("firecracker %s: vsock CONNECT %d answered %q (%v): is the agent listening on vsock port %d?: %w",
			m.cfg.ID, AgentVsockPort, line, err, AgentVsockPort, errdefs.ErrUnavailable)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// readLine reads one "\n"-terminated line byte by byte (nothing after it
// is consumed: the agent's stream follows), at most max bytes.
func readLine(c net.Conn, max int) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < max {
		if _, err := c.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return string(b), errors.New("line too long")
}

// Stop asks the guest to stop (SendCtrlAltDel: with reboot=k the kernel
// resets, and Firecracker exits), then kills the VMM when ctx ends.
func (m *Machine) Stop(ctx context.Context) error {
	m.mu.Lock()
	m.requested = true
	st := m.state
	m.mu.Unlock()
	if st == stateExited {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, stopTimeout)
		defer cancel()
	}
	if st == stateRunning {
		if err := m.api.put(ctx, "/actions", instanceAction{ActionType: "SendCtrlAltDel"}); err != nil {
			m.d.log.Debug("SendCtrlAltDel", "id", m.cfg.ID, "err", err)
		}
	}
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
	}
	return m.Kill()
}

// Kill ends the VMM process at once.
func (m *Machine) Kill() error {
	m.mu.Lock()
	m.requested = true
	m.mu.Unlock()
	if m.cmd == nil {
		return nil
	}
	if err := m.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("firecracker %s: kill: %w", m.cfg.ID, err)
	}
	<-m.done
	return nil
}
