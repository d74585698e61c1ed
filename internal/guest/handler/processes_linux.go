package handler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/reaper"
	"github.com/forkd-dev/forkd/internal/httpquery"
)

// processTable holds the running execs by guest pid, from their start until
// their process exits, for PathProcesses and its stdin and signal paths.
// An entry lives as long as its process: the exec removes it once the
// process is reaped, before its exit event. A request that looked an entry
// up just before that still holds it; the signal path checks under the
// reaper's lock (Process.SignalGroup), the stdin path finds it closed.
type processTable struct {
	mu sync.Mutex // guards m
	m  map[int]*process
}

// process is one running exec.
type process struct {
	proc *reaper.Process
	info agentapi.ProcessInfo // StdinOpen is filled in by list
	// stdin is the write end of the process's stdin when the exec asked for
	// StdinOpen; nil otherwise (stdin is /dev/null, or only the exec's
	// request body feeds it).
	stdin *stdinPipe
	// tty is the master of the process's terminal (ExecRequest.PTY), for
	// resizing; nil for an exec with pipes.
	tty *os.File
}

func (t *processTable) add(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[int]*process)
	}
	t.m[p.info.Pid] = p
}

func (t *processTable) remove(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[p.info.Pid] == p {
		delete(t.m, p.info.Pid)
	}
}

// lookup returns the running exec whose pid the path's {pid} names.
func (t *processTable) lookup(r *http.Request) (*process, error) {
	s := r.PathValue("pid")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("process id %q: want the positive pid an exec reported: %w", s, errdefs.ErrInvalidArgument)
	}
	t.mu.Lock()
	p := t.m[pid]
	t.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("no running exec with pid %d (it exited, or was not started by exec): %w", pid, errdefs.ErrNotFound)
	}
	return p, nil
}

func (t *processTable) list() []agentapi.ProcessInfo {
	t.mu.Lock()
	out := make([]agentapi.ProcessInfo, 0, len(t.m))
	for _, p := range t.m {
		info := p.info
		info.StdinOpen = p.stdin != nil && !p.stdin.closed.Load()
		out = append(out, info)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b agentapi.ProcessInfo) int { return a.Pid - b.Pid })
	return out
}

// stdinPipe is the agent's end of a process's stdin. Writers take mu: the
// exec's request body for each chunk, a PathProcesses stdin request for
// its whole body, so bytes of one request are never interleaved with
// another's. Nothing is buffered beyond the pipe (64 KiB in the kernel) and
// one chunk per writer: a process that does not read blocks its writers.
//
// For an exec with a terminal, f is the terminal's master (shared with the
// output pump): the end of input types the EOF character instead of
// closing f, and the process runs on.
type stdinPipe struct {
	f *os.File
	// keep: the end of the exec's request body does not close stdin
	// (ExecRequest.StdinOpen).
	keep   bool
	tty    bool // f is a terminal's master
	mu     sync.Mutex
	closed atomic.Bool
	once   sync.Once
	// midLine (under mu) is set when the last byte written to a terminal
	// ended no line: its EOF character then only submits the line, and
	// a second one is the end of input.
	midLine bool
}

// eofWait bounds typing the EOF into a terminal whose program does not
// read (raw mode, stopped) and whose input queue is full.
const eofWait = 10 * time.Second

var errStdinClosed = errors.New("stdin is closed")

// close ends the input (EOF for the process): a pipe is closed without
// waiting for writers (a write blocked on a full pipe returns with an
// error); a terminal gets its EOF character once, after the writer
// holding the lock.
func (p *stdinPipe) close() {
	if !p.tty {
		p.release()
		return
	}
	p.once.Do(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.closed.Swap(true) { // not released in the meantime
			eof := []byte{eofChar(p.f)}
			if p.midLine {
				eof = append(eof, eof[0])
			}
			p.f.SetWriteDeadline(time.Now().Add(eofWait))
			p.f.Write(eof)
		}
	})
}

// release ends the input because nobody may write any more (the process
// exited, or a write failed): a pipe is closed; a terminal is marked
// closed and a write blocked on it returns, without typing EOF (the exec
// closes the master itself).
func (p *stdinPipe) release() {
	if !p.tty {
		p.once.Do(func() {
			p.closed.Store(true)
			p.f.Close()
		})
		return
	}
	// Not under once or mu: a close blocked typing EOF into a full
	// terminal holds both, and returns when the deadline passes.
	p.closed.Store(true)
	p.f.SetWriteDeadline(time.Unix(1, 0))
}

// feed copies the exec's request body to stdin, then closes stdin unless
// it is kept open. A failed write (the process closed its stdin or exited)
// ends it; the rest of the body is not read.
func (p *stdinPipe) feed(body io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			p.mu.Lock()
			werr := errStdinClosed
			if !p.closed.Load() {
				_, werr = p.f.Write(buf[:n])
				p.noteWritten(buf[:n])
			}
			p.mu.Unlock()
			if werr != nil {
				p.release()
				return
			}
		}
		if rerr != nil {
			break
		}
	}
	if !p.keep {
		p.close()
	}
}

// write appends r to stdin under the writers' lock. When ctx ends (the host
// gave up) a write the process does not read is abandoned. werr reports a
// failed write to the pipe, rerr a failed read of r.
func (p *stdinPipe) write(ctx context.Context, r io.Reader) (n int64, werr, rerr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return 0, errStdinClosed, nil
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		p.f.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	ew := &errWriter{w: p.f, note: p.noteWritten}
	n, err := io.Copy(ew, r)
	if !stop() {
		<-fired // the deadline is set; clear it after the cut write
	}
	p.f.SetWriteDeadline(time.Time{})
	if ew.err != nil {
		return n, ew.err, nil
	}
	return n, nil, err
}

// errWriter remembers the error of its writer, so a copy's write errors can
// be told from its read errors.
type errWriter struct {
	w    io.Writer
	err  error
	note func([]byte) // told what was written, if set
}

func (e *errWriter) Write(b []byte) (int, error) {
	n, err := e.w.Write(b)
	if err != nil {
		e.err = err
	}
	if e.note != nil {
		e.note(b[:n])
	}
	return n, err
}

// noteWritten remembers, under mu, whether b (written to stdin) left a
// terminal's line open.
func (p *stdinPipe) noteWritten(b []byte) {
	if p.tty && len(b) > 0 {
		last := b[len(b)-1]
		p.midLine = last != '\n' && last != '\r'
	}
}

func (a *Agent) handleListProcesses(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, a.procs.list())
}

// handleProcessStdin appends the request body to a process's stdin, then
// closes it when ?close=1. Closing a stdin that is already closed, with no
// bytes to write, succeeds: close is idempotent.
func (a *Agent) handleProcessStdin(w http.ResponseWriter, r *http.Request) {
	p, err := a.procs.lookup(r)
	if err != nil {
		writeProblem(w, err)
		return
	}
	closeAfter, err := httpquery.Bool(r.URL.Query(), "close", false)
	if err != nil {
		writeProblem(w, err)
		return
	}
	pid := p.info.Pid
	if p.stdin == nil {
		writeProblem(w, fmt.Errorf("process %d was not started with stdin_open: its stdin is /dev/null or its exec request's body: %w", pid, errdefs.ErrFailedPrecondition))
		return
	}
	n, werr, rerr := p.stdin.write(r.Context(), r.Body)
	switch {
	case errors.Is(werr, errStdinClosed):
		if closeAfter && bodyEmpty(r.Body) {
			break // closing a closed stdin
		}
		writeProblem(w, fmt.Errorf("stdin of process %d is closed: %w", pid, errdefs.ErrFailedPrecondition))
		return
	case errors.Is(werr, syscall.EPIPE):
		p.stdin.release()
		writeProblem(w, fmt.Errorf("process %d closed its stdin (%d bytes of this request were written first): %w", pid, n, errdefs.ErrFailedPrecondition))
		return
	case errors.Is(werr, os.ErrClosed):
		writeProblem(w, fmt.Errorf("process %d exited or its stdin was closed while this request wrote to it (%d bytes written): %w", pid, n, errdefs.ErrFailedPrecondition))
		return
	case errors.Is(werr, os.ErrDeadlineExceeded):
		writeProblem(w, fmt.Errorf("the request ended while process %d was not reading its stdin (%d bytes written): %w", pid, n, errdefs.ErrCanceled))
		return
	case werr != nil:
		writeProblem(w, fmt.Errorf("writing to the stdin of process %d: %v: %w", pid, werr, errdefs.ErrInternal))
		return
	case rerr != nil:
		writeProblem(w, fmt.Errorf("reading the request body (%d bytes went to process %d): %v: %w", n, pid, rerr, errdefs.ErrCanceled))
		return
	}
	if closeAfter {
		p.stdin.close()
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleProcessSignal sends a signal to the process group of an exec (the
// process and what it started, unless they left the group).
func (a *Agent) handleProcessSignal(w http.ResponseWriter, r *http.Request) {
	p, err := a.procs.lookup(r)
	if err != nil {
		writeProblem(w, err)
		return
	}
	var req agentapi.SignalRequest
	if err := readControl(r, &req, "the signal request", "", true); err != nil {
		writeProblem(w, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		writeProblem(w, err)
		return
	}
	// Not KillGroup: between the lookup and the kill the leader may have
	// been reaped and its pid taken by another exec's group.
	if err := p.proc.SignalGroup(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			err = fmt.Errorf("process %d has exited: %w", p.info.Pid, errdefs.ErrNotFound)
		} else {
			err = fmt.Errorf("signalling process group %d: %v: %w", p.info.Pid, err, errdefs.ErrInternal)
		}
		writeProblem(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseSignal accepts "SIGTERM", "TERM" or "term"; "" is SIGKILL.
func parseSignal(name string) (unix.Signal, error) {
	if name == "" {
		return unix.SIGKILL, nil
	}
	n := strings.ToUpper(name)
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	sig := unix.SignalNum(n)
	if sig == 0 {
		return 0, fmt.Errorf("unknown signal %q: use a name such as SIGTERM, SIGINT or SIGKILL: %w", name, errdefs.ErrInvalidArgument)
	}
	return sig, nil
}

// bodyEmpty reports whether nothing is left to read in body.
func bodyEmpty(body io.Reader) bool {
	var b [1]byte
	n, _ := io.ReadFull(body, b[:])
	return n == 0
}
