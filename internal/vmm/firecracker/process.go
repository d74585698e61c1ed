package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// socketTimeout bounds the wait for the API socket when the context has
// no deadline.
const socketTimeout = 10 * time.Second

// Files in a machine's run dir (no jailer), or in its jail's root.
const (
	apiSockName   = "api.sock"
	vsockName     = "vsock.sock"
	stderrLogName = "firecracker.log"
	consoleName   = "console.log"
)

// versionTimeout bounds `firecracker --version` when the context has no
// deadline.
const versionTimeout = 10 * time.Second

// binaryVersion runs `firecracker --version` ("Firecracker v1.10.1"),
// within the context's deadline, or versionTimeout when it has none.
func binaryVersion(ctx context.Context, path string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, versionTimeout)
		defer cancel()
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("firecracker: %s --version: %w", path, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	v := strings.TrimPrefix(strings.TrimSpace(first), "Firecracker ")
	if v == "" {
		return "", fmt.Errorf("firecracker: %s --version printed nothing: %w", path, errdefs.ErrInternal)
	}
	return strings.TrimPrefix(v, "v"), nil
}

// jailRoot is the chroot the jailer makes for a machine:
// <base>/<exec file name>/<id>/root.
func (d *Driver) jailRoot(id string) string {
	return filepath.Join(d.cfg.ChrootBase, filepath.Base(d.binary), id, "root")
}

// command builds the process: firecracker itself, or the jailer that
// execs it in its chroot (not daemonized: the jailer execs Firecracker
// in place, so the pid and the console pipe stay the machine's).
func (d *Driver) command(cfg vmm.MachineConfig) *exec.Cmd {
	if d.jailer == "" {
		return exec.Command(d.binary, "--api-sock", filepath.Join(cfg.RunDir, apiSockName), "--id", cfg.ID)
	}
	args := []string{"--id", cfg.ID, "--exec-file", d.binary,
		"--uid", strconv.Itoa(d.cfg.UID), "--gid", strconv.Itoa(d.cfg.GID),
		"--chroot-base-dir", d.cfg.ChrootBase, "--cgroup-version", "2"}
	if cfg.Network != nil && cfg.Network.NetNSPath != "" {
		args = append(args, "--netns", cfg.Network.NetNSPath)
	}
	args = append(args, "--", "--api-sock", "/"+apiSockName)
	return exec.Command(d.jailer, args...)
}

// start runs the VMM process and waits for its API socket.
func (d *Driver) start(ctx context.Context, cfg vmm.MachineConfig) (*Machine, error) {
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("firecracker %s: run dir: %w", cfg.ID, err)
	}
	m := newMachine(d, cfg)
	if d.jailer != "" {
		m.root = d.jailRoot(cfg.ID)
		if _, err := os.Stat(m.root); err == nil {
			return nil, fmt.Errorf("firecracker %s: jail %s exists (a VMM with this ID is running, or was left behind): %w", cfg.ID, m.root, errdefs.ErrAlreadyExists)
		}
	}
	sock := m.hostPath("/" + apiSockName)
	os.Remove(sock)
	cmd := d.command(cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	console, err := openConsole(m.consolePath())
	if err != nil {
		return nil, fmt.Errorf("firecracker %s: console log: %w", cfg.ID, err)
	}
	stderr, err := os.OpenFile(filepath.Join(cfg.RunDir, stderrLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		console.Close()
		return nil, fmt.Errorf("firecracker %s: %w", cfg.ID, err)
	}
	defer stderr.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = console, stderr
	run := cmd.Start
	if n := cfg.Network; n != nil && n.NetNSPath != "" && d.jailer == "" {
		// The jailer joins the namespace itself (--netns).
		run = func() error { return netns.DoPath(n.NetNSPath, cmd.Start) }
	}
	if err := run(); err != nil {
		console.Close()
		return nil, fmt.Errorf("firecracker %s: start %s: %w", cfg.ID, cmd.Path, err)
	}
	m.attach(cmd, console)
	if cfg.Nice != 0 {
		// Threads inherit the niceness of the thread that creates them:
		// set before the vCPU threads exist.
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, cfg.Nice); err != nil {
			d.log.Warn("set VMM priority", "id", cfg.ID, "err", err)
		}
	}
	if err := m.waitSocket(ctx, sock); err != nil {
		m.Kill()
		return nil, fmt.Errorf("firecracker %s: %w%s", cfg.ID, err, m.exitDetail())
	}
	m.api = newClient(sock)
	return m, nil
}

// waitSocket waits until the API socket accepts a connection, the
// process exits, or the context (or socketTimeout) ends.
func (m *Machine) waitSocket(ctx context.Context, sock string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, socketTimeout)
		defer cancel()
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-m.done:
			return fmt.Errorf("the VMM exited before its API socket %s was ready: %w", sock, errdefs.ErrUnavailable)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the API socket %s: %w", sock, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// hostPath is where a path Firecracker sees lies on the host: inside the
// jail's root with the jailer, the run dir's file without (inner is
// "/name").
func (m *Machine) hostPath(inner string) string {
	if m.root != "" {
		return filepath.Join(m.root, inner)
	}
	return filepath.Join(m.cfg.RunDir, inner)
}

// stage makes a host file visible to Firecracker and returns the path to
// give it: the file itself without the jailer; a hard link in the jail's
// root with it (a jailed Firecracker sees nothing else).
func (m *Machine) stage(host, name string) (string, error) {
	if m.root == "" {
		return host, nil
	}
	inner := "/" + name
	if err := os.Link(host, m.hostPath(inner)); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			return "", fmt.Errorf("link %s into the jail: it must be on the same file system as the jailer's chroot base %s: %w", host, m.d.cfg.ChrootBase, errdefs.ErrFailedPrecondition)
		}
		return "", fmt.Errorf("link %s into the jail: %w", host, err)
	}
	if err := os.Chown(m.hostPath(inner), m.d.cfg.UID, m.d.cfg.GID); err != nil {
		return "", fmt.Errorf("give %s to the jail's uid: %w", host, err)
	}
	return inner, nil
}

// inner is the path Firecracker is given for a file the driver creates
// for it: in the run dir without the jailer, in the jail's root with it.
func (m *Machine) inner(name string) string {
	if m.root != "" {
		return "/" + name
	}
	return filepath.Join(m.cfg.RunDir, name)
}

func (m *Machine) consolePath() string {
	if m.cfg.ConsoleLog != "" {
		return m.cfg.ConsoleLog
	}
	return filepath.Join(m.cfg.RunDir, consoleName)
}
