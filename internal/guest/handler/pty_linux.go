package handler

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/reaper"
)

// Terminals for execs that ask for one (ExecRequest.PTY). The agent keeps
// the master: the exec's output pump reads it, stdin writes to it, resize
// sets its window size. The process gets the slave as fds 0-2 and as its
// controlling terminal, in a session of its own, so its pid is also its
// group's id and the terminal's foreground group (^C reaches it).

// defaultTerm is TERM for a terminal whose request does not set it.
const defaultTerm = "xterm-256color"

// openPTY opens a new pseudo-terminal pair of the given size. The master
// is pollable (reads and writes take deadlines); the slave is for the
// child.
func openPTY(size agentapi.PTY) (master, slave *os.File, err error) {
	// devpts is mounted with ptmxmode=0666: /dev/pts/ptmx works where
	// /dev/ptmx (devtmpfs) is missing.
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		fd, err = unix.Open("/dev/pts/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	}
	if err != nil {
		return nil, nil, ptyError("opening /dev/ptmx", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	fail := func(what string, err error) (*os.File, *os.File, error) {
		master.Close()
		return nil, nil, ptyError(what, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlocking the terminal", err)
	}
	// TIOCGPTPEER opens the slave through the master, whatever devpts
	// instance /dev/pts is (Linux 4.13). O_NOCTTY: the slave must not
	// become the agent's own controlling terminal.
	sfd, err := openSlavePeer(fd)
	if err != nil {
		sfd, err = openSlaveByName(fd)
	}
	if err != nil {
		return fail("opening the terminal's slave", err)
	}
	slave = os.NewFile(uintptr(sfd), "/dev/pts")
	if err := setWinsize(master, size); err != nil {
		slave.Close()
		return fail("setting the terminal's size", err)
	}
	return master, slave, nil
}

func openSlavePeer(master int) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// openSlaveByName opens /dev/pts/N for the master fd, for kernels without
// TIOCGPTPEER.
func openSlaveByName(master int) (int, error) {
	n, err := unix.IoctlGetUint32(master, unix.TIOCGPTN)
	if err != nil {
		return -1, err
	}
	return unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
}

func ptyError(what string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return fmt.Errorf("%s: %v (no terminals left: close some): %w", what, err, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrInternal)
}

// setWinsize sets the terminal's size through its master; the kernel
// sends SIGWINCH to the foreground group when it changes.
func setWinsize(master *os.File, size agentapi.PTY) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)})
	}); err != nil {
		return err
	}
	return ierr
}

// eofChar is the terminal's EOF character (VEOF, ^D unless the program
// changed it). TCGETS on the master reads the slave's settings.
func eofChar(master *os.File) byte {
	c := byte(4)
	if rc, err := master.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS); err == nil && t.Cc[unix.VEOF] != 0 {
				c = t.Cc[unix.VEOF]
			}
		})
	}
	return c
}

// withTerm returns env with TERM set to defaultTerm unless it sets TERM.
func withTerm(env map[string]string) map[string]string {
	if _, ok := env["TERM"]; ok {
		return env
	}
	out := make(map[string]string, len(env)+1)
	for k, v := range env {
		out[k] = v
	}
	out["TERM"] = defaultTerm
	return out
}

// checkPTY validates a terminal size from a request.
func checkPTY(p agentapi.PTY) error {
	if msg := p.Check(); msg != "" {
		return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
	}
	return nil
}

// handleProcessResize sets the size of an exec's terminal.
func (a *Agent) handleProcessResize(w http.ResponseWriter, r *http.Request) {
	p, err := a.procs.lookup(r)
	if err != nil {
		writeProblem(w, err)
		return
	}
	var req agentapi.ResizeRequest
	if err := readControl(r, &req, "the resize request", `want {"rows":R,"cols":C}`, false); err != nil {
		writeProblem(w, err)
		return
	}
	if err := checkPTY(req); err != nil {
		writeProblem(w, err)
		return
	}
	if p.tty == nil {
		writeProblem(w, fmt.Errorf("process %d has no terminal (start it with pty): %w", p.info.Pid, errdefs.ErrFailedPrecondition))
		return
	}
	if err := setWinsize(p.tty, req); err != nil {
		if errors.Is(err, os.ErrClosed) || exited(p.proc) {
			// The exec closed the master as the process exited (the
			// error is then internal/poll's, not os.ErrClosed).
			err = fmt.Errorf("process %d has exited: %w", p.info.Pid, errdefs.ErrNotFound)
		} else {
			err = fmt.Errorf("resizing the terminal of process %d: %v: %w", p.info.Pid, err, errdefs.ErrInternal)
		}
		writeProblem(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// exited reports whether proc has exited.
func exited(proc *reaper.Process) bool {
	select {
	case <-proc.Done():
		return true
	default:
		return false
	}
}
