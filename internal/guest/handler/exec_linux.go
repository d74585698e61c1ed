package handler

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/procenv"
	"github.com/forkd-dev/forkd/internal/guest/reaper"
)

// execChunk is the largest Data of one output event; with the bounded event
// channel it caps what the agent buffers per process (a slow host makes the
// process block on a full pipe instead).
const (
	execChunk  = 32 << 10
	execEvents = 8
)

// execSpec is a validated ExecRequest.
type execSpec struct {
	path string
	argv []string
	env  []string
	cwd  string
	// cred is the user to run as; nil: the agent's (root).
	cred *syscall.Credential
	req  agentapi.ExecRequest
}

func (a *Agent) parseExec(r *http.Request) (execSpec, error) {
	var req agentapi.ExecRequest
	h := r.Header.Get(agentapi.ExecHeader)
	if h == "" {
		return execSpec{}, fmt.Errorf("missing %s header: %w", agentapi.ExecHeader, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal([]byte(h), &req); err != nil {
		return execSpec{}, fmt.Errorf("decoding %s: %v: %w", agentapi.ExecHeader, err, errdefs.ErrInvalidArgument)
	}
	var argv []string
	switch {
	case len(req.Argv) > 0 && req.Shell != "":
		return execSpec{}, fmt.Errorf("set argv or shell, not both: %w", errdefs.ErrInvalidArgument)
	case len(req.Argv) > 0:
		argv = req.Argv
		if argv[0] == "" {
			return execSpec{}, fmt.Errorf("argv[0] is empty: %w", errdefs.ErrInvalidArgument)
		}
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	default:
		return execSpec{}, fmt.Errorf("nothing to run: set argv or shell: %w", errdefs.ErrInvalidArgument)
	}
	if req.TimeoutMillis < 0 {
		return execSpec{}, fmt.Errorf("negative timeout: %w", errdefs.ErrInvalidArgument)
	}
	reqEnv := req.Env
	if req.PTY != nil {
		if err := checkPTY(*req.PTY); err != nil {
			return execSpec{}, err
		}
		reqEnv = withTerm(reqEnv)
	}
	if err := procenv.Validate(reqEnv); err != nil {
		return execSpec{}, err
	}
	env := procenv.Merge(a.cfg.Env, reqEnv)
	cred, env, err := a.execUser(req, env)
	if err != nil {
		return execSpec{}, err
	}
	path, err := procenv.LookPath(argv[0], env)
	if err != nil {
		return execSpec{}, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = defaultCwd(a.cfg.Cwd, env)
	} else if fi, err := os.Stat(cwd); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return execSpec{}, fmt.Errorf("working directory %q does not exist: %w", cwd, errdefs.ErrNotFound)
		}
		return execSpec{}, fsError(err)
	} else if !fi.IsDir() {
		return execSpec{}, fmt.Errorf("working directory %q is not a directory: %w", cwd, errdefs.ErrInvalidArgument)
	}
	return execSpec{path: path, argv: argv, env: env, cwd: cwd, cred: cred, req: req}, nil
}

// execUser resolves the request's user (else the image's): its
// credential, and env with HOME set to its home unless the request sets
// HOME. Root, or no user at all, runs as the agent does.
func (a *Agent) execUser(req agentapi.ExecRequest, env []string) (*syscall.Credential, []string, error) {
	spec := req.User
	if spec == "" {
		spec = a.cfg.User
	}
	if spec == "" {
		return nil, env, nil
	}
	u, err := procenv.LookupUser(spec)
	if err != nil {
		return nil, nil, err
	}
	if u.UID == 0 && u.GID == 0 {
		return nil, env, nil
	}
	if _, set := req.Env["HOME"]; !set && u.Home != "" {
		env = procenv.Merge(env, map[string]string{"HOME": u.Home})
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}, env, nil
}

// handleExec runs a process and streams its output as NDJSON ExecEvents,
// ending with exactly one exit event. Failures before the process starts
// are problem responses; once the 200 is sent, the exit event carries them.
func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	spec, err := a.parseExec(r)
	if err != nil {
		writeProblem(w, err)
		return
	}
	rc := http.NewResponseController(w)
	if spec.req.Stdin {
		// HTTP/1 servers stop reading a request once the response starts,
		// unless full duplex is on: stdin and output flow at the same time.
		if err := rc.EnableFullDuplex(); err != nil {
			writeProblem(w, fmt.Errorf("streaming stdin: %v: %w", err, errdefs.ErrInternal))
			return
		}
	}
	xio, err := openExecIO(spec.req)
	if err != nil {
		writeProblem(w, err)
		return
	}
	defer xio.closeOurs()
	stdinW := xio.stdin

	sys := &syscall.SysProcAttr{Setpgid: true} // its own group: a timeout kills what it started too
	if xio.tty != nil {
		// Its own session, led by it (so also its own group), with the
		// terminal as controlling tty (fd 0 in the child).
		sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	sys.Credential = spec.cred
	start := time.Now()
	proc, err := reaper.Default().Start(spec.path, spec.argv, &syscall.ProcAttr{
		Dir: spec.cwd, Env: spec.env, Files: xio.childFds(), Sys: sys,
	})
	if err != nil {
		writeProblem(w, startError(spec.argv[0], err))
		return
	}
	xio.started()

	// Listed (and reachable by pid) from before the host learns the pid
	// until the exit; the watcher below removes it.
	entry := &process{proc: proc, info: agentapi.ProcessInfo{
		Pid: proc.Pid, Argv: spec.argv, Shell: spec.req.Shell, Cwd: spec.cwd, Started: start,
	}}
	if spec.req.StdinOpen {
		entry.stdin = stdinW
	}
	entry.tty = xio.tty
	a.procs.add(entry)
	if xio.tty != nil && !spec.req.Stdin && !spec.req.StdinOpen {
		// No input at all: the terminal's input has ended, as /dev/null
		// would have.
		go stdinW.close()
	}

	if spec.req.Stdin {
		// Ends at the body's EOF (closing stdin unless it is kept open), or
		// when the process stops reading (EPIPE) or exits.
		go stdinW.feed(r.Body)
	}

	w.Header().Set(agentapi.PidHeader, strconv.Itoa(proc.Pid))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush() // the host learns the process started

	events := make(chan agentapi.ExecEvent, execEvents)
	var drain drainState
	var pumps sync.WaitGroup
	for _, o := range xio.outputs {
		pumps.Add(1)
		go a.pump(&pumps, o.f, o.typ, events, &drain)
	}
	go func() {
		pumps.Wait()
		close(events)
	}()

	// The watcher kills the group on timeout or when the host goes away,
	// and after the exit bounds how long output is still drained.
	var timedOut atomic.Bool
	go func() {
		var timeout <-chan time.Time
		if spec.req.TimeoutMillis > 0 {
			t := time.NewTimer(time.Duration(spec.req.TimeoutMillis) * time.Millisecond)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-proc.Done():
		case <-timeout:
			timedOut.Store(true)
			proc.KillGroup(unix.SIGKILL)
		case <-r.Context().Done():
			proc.KillGroup(unix.SIGKILL)
		}
		<-proc.Done()
		a.procs.remove(entry)
		if stdinW != nil {
			// A writer blocked on a full pipe (a child that inherited
			// stdin and does not read) returns now.
			stdinW.release()
		}
		drain.exited.Store(true)
		// Wake pumps blocked in Read; from now on each read waits at most
		// ExecQuiet (see pump).
		xio.setReadDeadline(time.Now().Add(a.cfg.ExecQuiet))
		// Children left running (`cmd &`) may keep the pipes (or the
		// terminal) open and busy; stop collecting after ExecDrain.
		time.AfterFunc(a.cfg.ExecDrain, func() {
			drain.over.Store(true)
			xio.setReadDeadline(time.Unix(1, 0))
		})
	}()

	enc := json.NewEncoder(w)
	writeErr := error(nil)
	for ev := range events {
		if writeErr != nil {
			continue // keep draining so the pumps finish
		}
		if writeErr = enc.Encode(ev); writeErr == nil && len(events) == 0 {
			writeErr = rc.Flush()
		}
		if writeErr != nil {
			// The host is gone: nobody will see the output.
			proc.KillGroup(unix.SIGKILL)
		}
	}
	st := proc.Wait()
	// Out of the table before the exit event, not only when the watcher
	// gets to it: a host that read the exit must not find the process
	// listed, or writable, or signallable.
	a.procs.remove(entry)
	exit := agentapi.ExecEvent{
		Type:           agentapi.EventExit,
		ExitCode:       st.ExitCode(),
		Signal:         st.Signal(),
		TimedOut:       timedOut.Load(),
		DurationMicros: time.Since(start).Microseconds(),
	}
	if writeErr == nil {
		enc.Encode(exit)
		rc.Flush()
	}
}

// drainState tells the pumps how the process is doing.
type drainState struct {
	exited atomic.Bool // the process has exited: reads wait at most ExecQuiet
	over   atomic.Bool // ExecDrain has passed since: stop reading
}

// pump turns one output pipe into events. Once the process has exited it
// stops at EOF, at the first read that waits longer than ExecQuiet and
// finds the pipe empty, or when the drain period is over. A terminal's
// master reads EIO once no process holds the terminal open: its EOF. Data already in
// the pipe when the process exits is read however slow the host is: the
// quiet period starts at each read, not at the exit.
func (a *Agent) pump(wg *sync.WaitGroup, f *os.File, typ string, events chan<- agentapi.ExecEvent, st *drainState) {
	defer wg.Done()
	buf := make([]byte, execChunk)
	for {
		if st.over.Load() {
			return
		}
		if st.exited.Load() {
			f.SetReadDeadline(time.Now().Add(a.cfg.ExecQuiet))
		}
		n, err := f.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) && !st.over.Load() {
			// A deadline (set only after the exit) does not mean the pipe
			// is empty: Go checks it before it reads, and a timer can wake
			// a read parked for data before the poller reports the data.
			// Either happens when this goroutine is starved for longer
			// than ExecQuiet (a loaded machine), and the process's last
			// output, already in the pipe, would be lost. Take what the
			// pipe holds now, without waiting: the deadline still ends a
			// drain that a background child keeps open and quiet.
			n, err = readReady(f, buf)
		}
		if n > 0 {
			events <- agentapi.ExecEvent{Type: typ, Data: append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			return // EOF, or quiet for ExecQuiet after the exit
		}
	}
}

// errPipeEmpty: readReady found nothing to read.
var errPipeEmpty = errors.New("pipe empty")

// readReady reads what the pipe f holds now, without waiting and whatever
// f's read deadline: errPipeEmpty if it holds nothing but is still open
// for writing, io.EOF if it holds nothing and all writers are gone. The
// pipe's reader is pump alone, so what poll reports cannot be taken by
// another reader before the read; the zero timeout means it cannot block,
// even if the descriptor were in blocking mode.
func readReady(f *os.File, buf []byte) (n int, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	cerr := rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			var k int
			k, err = unix.Poll(pfd, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			if k == 0 || pfd[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) == 0 {
				err = errPipeEmpty
				return
			}
			break
		}
		for {
			n, err = unix.Read(int(fd), buf)
			if err != unix.EINTR {
				break
			}
		}
	})
	switch {
	case cerr != nil:
		return 0, cerr
	case errors.Is(err, unix.EAGAIN):
		return 0, errPipeEmpty
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// startError classifies a failure of fork/exec.
func startError(name string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		// The executable exists (LookPath found it): its interpreter or a
		// library is missing.
		return fmt.Errorf("starting %q: %v (a missing interpreter or loader?): %w", name, err, errdefs.ErrNotFound)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.ENOEXEC):
		return fmt.Errorf("starting %q: %v: %w", name, err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, syscall.E2BIG), errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("starting %q: %v: %w", name, err, errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EMFILE):
		return fmt.Errorf("starting %q: %v: %w", name, err, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("starting %q: %v: %w", name, err, errdefs.ErrInternal)
}
