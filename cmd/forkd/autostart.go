package main

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

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/procfs"
)

func (g *globals) logPath() string { return filepath.Join(g.runDir, "forkd.log") }

// startDaemon launches `forkd serve` detached (own session, output to the
// log file) and waits until it answers, so one command works on a fresh
// machine.
func (g *globals) startDaemon(ctx context.Context) error {
	if pid, _ := daemonPID(g); pid > 0 {
		// A daemon owns the state (its pid file names a live `forkd
		// serve`) but does not answer yet: it is starting, adopting its
		// sandboxes. Wait for it; a second one could only fail on the
		// state lock.
		return g.awaitDaemon(ctx, pid, nil, "daemon (pid %d) finished starting")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(g.runDir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(g.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"serve", "--data-dir", g.dataDir, "--run-dir", g.runDir, "--socket", g.socketPath()}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start forkd daemon: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	return g.awaitDaemon(ctx, cmd.Process.Pid, exited, "started daemon (pid %d)")
}

// daemonStartWait bounds how long the CLI waits for a daemon it started,
// or found starting, to answer. Generous: a daemon re-adopts every sandbox
// it left running before it listens, which on a busy host with many of
// them takes a while. A daemon that exits is noticed at once.
var daemonStartWait = 2 * time.Minute

// awaitDaemon waits up to daemonStartWait for daemon pid to answer on the
// socket, and returns at once if it exits. exited, when not nil, closes
// when it exits (a child of this process); otherwise the pid is polled.
// done is the message on success, with the pid.
func (g *globals) awaitDaemon(ctx context.Context, pid int, exited <-chan struct{}, done string) error {
	c := client.New(g.socketPath())
	gone := func() bool {
		if exited != nil {
			select {
			case <-exited:
				return true
			default:
				return false
			}
		}
		return !daemonRunning(pid)
	}
	exitedErr := func() error {
		return fmt.Errorf("forkd daemon exited at start; its log %s says:\n%s: %w", g.logPath(), tailFile(g.logPath(), 1500), errdefs.ErrUnavailable)
	}
	wait := daemonStartWait
	deadline := time.Now().Add(wait)
	// A daemon that accepts but does not answer cannot hold a ping past
	// the deadline.
	pingCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for time.Now().Before(deadline) {
		if gone() {
			return exitedErr()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if c.Ping(pingCtx) == nil {
			fmt.Fprintf(os.Stderr, "forkd: "+done+" (socket %s, log %s)\n", pid, g.socketPath(), g.logPath())
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if gone() {
		return exitedErr()
	}
	msg := fmt.Sprintf("forkd daemon (pid %d) is running but did not answer on %s within %s (it may still be adopting its sandboxes; `forkd daemon status` tells when it answers)", pid, g.socketPath(), wait)
	if tail := tailFile(g.logPath(), 1500); tail != "" {
		return fmt.Errorf("%s; its log %s ends:\n%s: %w", msg, g.logPath(), tail, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s; see its log %s: %w", msg, g.logPath(), errdefs.ErrUnavailable)
}

// daemonRunning: pid has not exited, as far as this process can tell. A
// zombie (exited, its parent has not reaped it yet) answers kill(pid, 0)
// but is not running; a process of another user answers EPERM, and one
// whose /proc entry this process cannot read (hidepid) counts as running
// until kill says it is gone.
func daemonRunning(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	st, err := procfs.ReadStat(pid)
	return err != nil || !st.Exited()
}

func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, _ := f.Stat()
	if st.Size() > n {
		f.Seek(st.Size()-n, 0)
	}
	buf := make([]byte, n)
	k, _ := f.Read(buf)
	return strings.TrimSpace(string(buf[:k]))
}

func (g *globals) pidPath() string { return filepath.Join(g.runDir, "forkd.pid") }

// daemonPID returns the pid of the daemon serving this socket, or 0. The
// socket's peer is asked first (SO_PEERCRED names the process that listens
// on it); the pid file only when nothing answers, and only if the process
// it names is a `forkd serve` (see checkDaemonProcess). stale, when set,
// says why the pid file names no daemon.
func daemonPID(g *globals) (pid int, stale string) {
	if pid := socketPeerPID(g.socketPath()); pid > 0 {
		return pid, ""
	}
	data, err := os.ReadFile(g.pidPath())
	if err != nil {
		return 0, ""
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Sprintf("it holds %q, not a pid", strings.TrimSpace(string(data)))
	}
	if err := checkDaemonProcess(pid); err != nil {
		return 0, err.Error()
	}
	return pid, ""
}

// socketPeerPID is the pid of the process listening on a Unix socket, 0 if
// none answers (or it runs in another pid namespace).
func socketPeerPID(sock string) int {
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return 0
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return 0
	}
	return int(cred.Pid)
}

// checkDaemonProcess fails unless pid is a running `forkd serve`: its
// executable is this forkd binary or one named forkd*, and its command line
// has the serve subcommand. A pid file outlives a daemon killed with
// SIGKILL, and its pid may since belong to any process.
func checkDaemonProcess(pid int) error {
	argv, err := procfs.WaitCmdline(context.Background(), pid)
	if errors.Is(err, procfs.ErrNoCmdline) {
		return fmt.Errorf("process %d is not a forkd daemon (it has no command line)", pid)
	}
	if err != nil {
		return fmt.Errorf("process %d is not running", pid)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		// Another user's process (a root daemon seen by a non-root CLI):
		// its command line is all there is.
		exe = argv[0]
	}
	// A binary replaced since the daemon started (make build) reads as
	// "PATH (deleted)".
	exe = strings.TrimSuffix(exe, " (deleted)")
	self, _ := os.Executable()
	isForkd := exe == self || strings.HasPrefix(filepath.Base(exe), "forkd")
	if !isForkd || forkdSubcommand(argv) != "serve" {
		return fmt.Errorf("process %d is %q, not a forkd daemon", pid, strings.Join(argv, " "))
	}
	return nil
}

// forkdSubcommand is the command a forkd command line runs ("serve",
// "bench spawn"), resolved as cobra resolves it, flags and their values
// skipped; "" when it names none. An argument of the command (`forkd exec
// ID -- npm run serve`) is not a command.
func forkdSubcommand(argv []string) string {
	if len(argv) < 2 {
		return ""
	}
	root := newRootCmd(&globals{})
	cmd, _, err := root.Find(argv[1:])
	if err != nil || cmd == root {
		return ""
	}
	return strings.TrimPrefix(cmd.CommandPath(), root.Name()+" ")
}

// pidfdOpen is unix.PidfdOpen; a test replaces it to play a kernel
// without pidfd_open.
var pidfdOpen = unix.PidfdOpen

// stopDaemon sends SIGTERM to the daemon and waits up to wait for it to
// exit. The signal goes through a pidfd opened before the process is
// checked, so a pid reused after the check cannot receive it. A pid file
// that names no daemon is removed (msg says so); nothing is signalled.
// Kernels without pidfd_open (before 5.3, or a seccomp filter refusing
// it) get kill(2) right after the check, and the exit is polled.
func stopDaemon(g *globals, wait time.Duration) (pid int, stopped bool, msg string, err error) {
	pid, stale := daemonPID(g)
	if pid == 0 {
		msg = "forkd daemon is not running"
		if stale != "" {
			if err := os.Remove(g.pidPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
				return 0, false, "", fmt.Errorf("remove stale pid file: %w", err)
			}
			msg += fmt.Sprintf("; removed the stale pid file %s (%s)", g.pidPath(), stale)
		}
		return 0, false, msg, nil
	}
	pidfd, err := pidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return pid, false, "forkd daemon is not running", nil
	}
	if err != nil {
		return stopDaemonByPid(pid, wait)
	}
	defer unix.Close(pidfd)
	if err := checkDaemonProcess(pid); err != nil {
		return pid, false, "", fmt.Errorf("not stopping it: %w", err)
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return pid, true, "forkd daemon stopped", nil
		}
		return pid, false, "", fmt.Errorf("signal daemon pid %d: %w", pid, err)
	}
	// A pidfd polls readable once its process has exited.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return pid, false, "", fmt.Errorf("daemon pid %d still running after %s: %w", pid, wait, errdefs.ErrUnavailable)
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return pid, false, "", fmt.Errorf("wait for daemon pid %d: %w", pid, err)
		}
		if n > 0 {
			return pid, true, "forkd daemon stopped", nil
		}
	}
}

// stopDaemonByPid is stopDaemon without a pidfd: the pid could in
// principle be reused between the check and the kill, a window of
// microseconds that pidfd_open closes where the kernel has it.
func stopDaemonByPid(pid int, wait time.Duration) (int, bool, string, error) {
	if err := checkDaemonProcess(pid); err != nil {
		return pid, false, "", fmt.Errorf("not stopping it: %w", err)
	}
	if err := unix.Kill(pid, unix.SIGTERM); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return pid, true, "forkd daemon stopped", nil
		}
		return pid, false, "", fmt.Errorf("signal daemon pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(wait)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			return pid, false, "", fmt.Errorf("daemon pid %d still running after %s: %w", pid, wait, errdefs.ErrUnavailable)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return pid, true, "forkd daemon stopped", nil
}

// processAlive: pid exists and has not exited. A zombie (exited, not yet
// reaped by its parent) answers kill(pid, 0) but is not alive.
func processAlive(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && !st.Exited()
}

func daemonCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "daemon", Short: "Start, stop or inspect the local daemon"}
	cmd.AddCommand(&cobra.Command{
		Use: "start", Short: "Start the daemon in the background", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if client.New(g.socketPath()).Ping(cmd.Context()) != nil {
				if err := g.startDaemon(cmd.Context()); err != nil {
					return err
				}
			} else if !g.jsonOut {
				fmt.Println("forkd daemon already running on", g.socketPath())
			}
			if g.jsonOut {
				pid, _ := daemonPID(g)
				return printJSON(map[string]any{"running": true, "pid": pid, "socket": g.socketPath()})
			}
			return nil
		},
	}, &cobra.Command{
		Use: "stop", Short: "Stop the daemon (sandboxes keep running unless it was started with --stop-sandboxes; the next daemon re-adopts them)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pid, stopped, msg, err := stopDaemon(g, 30*time.Second)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(map[string]any{"stopped": stopped, "pid": pid, "message": msg})
			}
			fmt.Println(msg)
			return nil
		},
	}, &cobra.Command{
		Use: "status", Short: "Say whether the daemon runs; exits 1 when it does not (with --json too)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := client.New(g.socketPath()).Version(cmd.Context())
			pid, _ := daemonPID(g)
			if g.jsonOut {
				out := map[string]any{"running": err == nil, "pid": pid, "socket": g.socketPath(), "version": v}
				if err != nil {
					out["error"] = err.Error()
				}
				if perr := printJSON(out); perr != nil {
					return perr
				}
				if err != nil {
					return exitError{1} // as without --json: scripts test the exit code
				}
				return nil
			}
			if err != nil {
				fmt.Println("forkd daemon is not running:", err)
				return exitError{1}
			}
			fmt.Printf("forkd daemon %s running (pid %d) on %s; VMM %s %s, data in %s\n", v.Version, pid, g.socketPath(), v.VMM, v.VMMVersion, v.DataDir)
			return nil
		},
	}, daemonLogsCmd(g))
	return cmd
}
