package pysession

import (
	"bufio"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/procenv"
	"github.com/forkd-dev/forkd/internal/guest/reaper"
)

//go:embed pyrunner.py
var runnerScript []byte

// Config configures a session.
type Config struct {
	// Python is the interpreter, looked up in Env's PATH; default "python3".
	Python string
	// Dir is where the runner script is written (created); default
	// /run/forkd.
	Dir string
	// Env is the process environment; default procenv.Default.
	Env []string
	// Cwd is the working directory; default HOME from Env if it exists,
	// else "/".
	Cwd string
	// MaxOutput bounds the stdout and the stderr kept per request; default
	// 8 MiB each.
	MaxOutput int
	// InterruptGrace is how long code may ignore an interrupt before it is
	// interrupted again; after three tries the process is killed. Default 1s.
	InterruptGrace time.Duration
	// StartTimeout bounds the interpreter's start; default 60s (an emulated
	// guest starts python3 in ~0.3-0.8 s).
	StartTimeout time.Duration
}

// Session is a running Python process.
type Session struct {
	cfg    Config
	proc   *reaper.Process
	reqW   *os.File
	resps  chan response // closed when fd 4 reaches EOF
	stdout *collector
	stderr *collector
	token  string
	sem    chan struct{} // one request at a time
	nextID int64         // guarded by sem

	// pendingSeed is a reseed not yet sent to Python; whoever holds sem
	// next sends it first (see SetSeed). Guarded by seedMu.
	seedMu      sync.Mutex
	pendingSeed []byte

	version string
	mu      sync.Mutex
	killed  string // why the agent killed the process, if it did
}

type response struct {
	ID      int64               `json:"id"`
	Python  string              `json:"python,omitempty"`
	Result  map[string]string   `json:"result,omitempty"`
	Display []map[string]string `json:"display,omitempty"`
	Error   *agentapi.CodeError `json:"error,omitempty"`
}

// ErrDead is wrapped by the errors of a session whose process has exited.
var ErrDead = errors.New("the Python session is not running")

// Start starts the interpreter with the runner and waits for it to answer.
func Start(ctx context.Context, cfg Config) (*Session, error) {
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.Dir == "" {
		cfg.Dir = "/run/forkd"
	}
	if cfg.Env == nil {
		cfg.Env = procenv.Default
	}
	cfg.Env = procenv.Merge(cfg.Env, map[string]string{"PYTHONUNBUFFERED": "1"})
	if cfg.Cwd == "" {
		cfg.Cwd = "/"
		if home := procenv.Get(cfg.Env, "HOME"); home != "" {
			if fi, err := os.Stat(home); err == nil && fi.IsDir() {
				cfg.Cwd = home
			}
		}
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = 8 << 20
	}
	if cfg.InterruptGrace <= 0 {
		cfg.InterruptGrace = time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}

	python, err := procenv.LookPath(cfg.Python, cfg.Env)
	if err != nil {
		return nil, fmt.Errorf("starting the Python session: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("starting the Python session: %w", err)
	}
	script := filepath.Join(cfg.Dir, "pyrunner.py")
	if err := os.WriteFile(script, runnerScript, 0o644); err != nil {
		return nil, fmt.Errorf("starting the Python session: %w", err)
	}
	var tok [8]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])

	// Pipes: the child's ends are closed here once it has them.
	var parentEnds, childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		return
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	childEnds = append(childEnds, null)
	outR, outW, err1 := pipe()
	errR, errW, err2 := pipe()
	reqR, reqW, err3 := pipe()
	respR, respW, err4 := pipe()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		for _, f := range []*os.File{null, outR, outW, errR, errW, reqR, reqW, respR, respW} {
			if f != nil {
				f.Close()
			}
		}
		return nil, fmt.Errorf("starting the Python session: %w", err)
	}
	parentEnds = append(parentEnds, outR, errR, reqW, respR)
	childEnds = append(childEnds, outW, errW, reqR, respW)

	proc, err := reaper.Default().Start(python, []string{python, "-u", script, token}, &syscall.ProcAttr{
		Dir:   cfg.Cwd,
		Env:   cfg.Env,
		Files: []uintptr{null.Fd(), outW.Fd(), errW.Fd(), reqR.Fd(), respW.Fd()},
		// Its own process group: a timeout's SIGINT also reaches what user
		// code started (os.system ignores SIGINT while it waits).
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	closeAll(childEnds)
	if err != nil {
		closeAll(parentEnds)
		return nil, fmt.Errorf("starting the Python session (%s): %v: %w", python, err, errdefs.ErrFailedPrecondition)
	}

	s := &Session{
		cfg:    cfg,
		proc:   proc,
		reqW:   reqW,
		resps:  make(chan response, 1),
		stdout: newCollector(token, cfg.MaxOutput),
		stderr: newCollector(token, cfg.MaxOutput),
		token:  token,
		sem:    make(chan struct{}, 1),
		nextID: 1,
	}
	go s.stdout.run(outR)
	go s.stderr.run(errR)
	go s.readResponses(respR)

	t := time.NewTimer(cfg.StartTimeout)
	defer t.Stop()
	select {
	case r, ok := <-s.resps:
		if ok && r.ID == 0 {
			s.version = r.Python
			return s, nil
		}
		err = fmt.Errorf("the Python runner answered %+v instead of its greeting", r)
	case <-t.C:
		err = fmt.Errorf("python did not start within %v", cfg.StartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.Close()
	return nil, fmt.Errorf("starting the Python session: %v%s: %w", err, s.stderrNote(), errdefs.ErrFailedPrecondition)
}

func (s *Session) readResponses(r *os.File) {
	defer r.Close()
	defer close(s.resps)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 256<<20) // a repr may be large
	for sc.Scan() {
		var resp response
		if err := json.Unmarshal(sc.Bytes(), &resp); err != nil {
			continue // not from the runner (user code wrote to fd 4)
		}
		s.resps <- resp
	}
}

// Version is the interpreter's version ("3.11.2").
func (s *Session) Version() string { return s.version }

// Pid is the interpreter's process id.
func (s *Session) Pid() int { return s.proc.Pid }

// Alive reports whether the process is still running.
func (s *Session) Alive() bool {
	select {
	case <-s.proc.Done():
		return false
	default:
		return true
	}
}

// Close kills the process (and its process group).
func (s *Session) Close() {
	s.kill("closed")
	s.reqW.Close()
}

func (s *Session) kill(why string) {
	s.mu.Lock()
	if s.killed == "" {
		s.killed = why
	}
	s.mu.Unlock()
	_ = s.proc.KillGroup(unix.SIGKILL)
	_ = s.proc.Signal(unix.SIGKILL)
}

// DeadError describes why the process is gone, with its last stderr.
func (s *Session) DeadError() error {
	st := s.proc.Wait()
	s.mu.Lock()
	why := s.killed
	s.mu.Unlock()
	msg := "the Python session exited (" + st.String() + ")"
	if why != "" {
		msg = "the Python session was killed (" + why + ")"
	}
	return fmt.Errorf("%s%s; start a new one: %w", msg, s.stderrNote(), ErrDead)
}

func (s *Session) stderrNote() string {
	tail := strings.TrimSpace(s.stderr.lastBytes())
	if tail == "" {
		return ""
	}
	if len(tail) > 2000 {
		tail = "..." + tail[len(tail)-2000:]
	}
	return "; stderr: " + tail
}

// Run runs code and returns its outcome. Python exceptions are reported in
// the result, not as an error; errors mean the session could not run the
// code (ctx ended while queued, the process died: ErrDead). timeout <= 0
// means none. If ctx ends while the code runs, the code is interrupted as on
// a timeout and ctx's error is returned.
func (s *Session) Run(ctx context.Context, code string, timeout time.Duration) (agentapi.RunCodeResult, error) {
	return s.run(ctx, code, timeout, nil, nil)
}

// Output receives the output of a streamed run: stream is
// agentapi.EventStdout or agentapi.EventStderr, data is never empty.
type Output func(stream, data string)

// Streaming parameters: output is handed to Output at most streamDelay
// after it was read (small writes are coalesced until then), at once when
// streamChunk bytes are waiting; the reader stops reading ahead of a slow
// consumer at streamHold bytes.
const (
	streamDelay = 20 * time.Millisecond
	streamChunk = 32 << 10
	streamHold  = 256 << 10
)

// RunStream runs code as Run does, but hands its output to out as it
// appears instead of returning it: the result's Stdout and Stderr are
// empty, all of the output has gone to out when RunStream returns. out is
// called from one goroutine at a time, never after RunStream has returned,
// and its chunks never split a UTF-8 character (bytes that are not UTF-8
// pass as they are). A slow out slows the code down (its writes block on a
// full pipe) rather than losing output, until the code is interrupted or
// done. started, if not nil, is called once the request holds the session
// (after queueing and a pending reseed), just before the code starts:
// errors before it are the call's, errors after it happened while the code
// ran.
func (s *Session) RunStream(ctx context.Context, code string, timeout time.Duration, started func(), out Output) (agentapi.RunCodeResult, error) {
	if out == nil {
		out = func(string, string) {}
	}
	return s.run(ctx, code, timeout, started, out)
}

// run serves Run (out nil: output is collected into the result) and
// RunStream.
func (s *Session) run(ctx context.Context, code string, timeout time.Duration, started func(), out Output) (agentapi.RunCodeResult, error) {
	if err := s.acquire(ctx); err != nil {
		return agentapi.RunCodeResult{}, err
	}
	defer s.release()
	if err := s.sendPendingSeed(ctx); err != nil {
		return agentapi.RunCodeResult{}, err
	}
	if started != nil {
		started()
	}
	start := time.Now()
	finish := func() {}
	if out != nil {
		finish = s.stream(out)
	}
	r, timedOut, err := s.call(ctx, map[string]any{"op": "run", "code": code}, timeout)
	res := agentapi.RunCodeResult{DurationMicros: time.Since(start).Microseconds()}
	if out != nil {
		finish() // delivers the rest; the result carries no output
	} else {
		res.Stdout, res.Stderr = s.stdout.take(true), s.stderr.take(true)
	}
	if err != nil {
		if timedOut && errors.Is(err, ErrDead) {
			// It ignored every interrupt and was killed: report the
			// timeout; the next call learns the session is gone.
			res.TimedOut = true
			res.Error = &agentapi.CodeError{
				Name:  "TimeoutError",
				Value: fmt.Sprintf("code ran past its timeout of %v and ignored interrupts; the Python session was killed and its variables are lost", timeout),
			}
			return res, nil
		}
		return res, err
	}
	res.Result, res.Display, res.Error = r.Result, r.Display, r.Error
	if timedOut {
		// Whatever the code did after the interrupt (raised
		// KeyboardInterrupt, or returned because the interrupt killed the
		// child it waited for), the outcome is a timeout.
		res.TimedOut = true
		res.Result = nil
		tb := ""
		if res.Error != nil {
			tb = res.Error.Traceback
		}
		res.Error = &agentapi.CodeError{
			Name:      "TimeoutError",
			Value:     fmt.Sprintf("code ran past its timeout of %v and was interrupted; the session and its variables are kept", timeout),
			Traceback: tb,
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// stream starts handing the collectors' output to out; the returned func
// stops it after delivering everything collected so far.
func (s *Session) stream(out Output) (finish func()) {
	hold := min(streamHold, max(s.cfg.MaxOutput/2, 1))
	s.stdout.setHold(hold)
	s.stderr.setHold(hold)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pumpOutput(stop, out)
	}()
	return func() {
		close(stop)
		<-done
		s.unhold()
		if o := s.stdout.take(true); o != "" {
			out(agentapi.EventStdout, o)
		}
		if e := s.stderr.take(true); e != "" {
			out(agentapi.EventStderr, e)
		}
	}
}

// unhold lets the collectors read on however far ahead of a consumer.
func (s *Session) unhold() {
	s.stdout.setHold(0)
	s.stderr.setHold(0)
}

// pumpOutput hands output to out until stop: a chunk of output is
// delivered streamDelay after its first byte was read, or as soon as
// streamChunk bytes are waiting.
func (s *Session) pumpOutput(stop <-chan struct{}, out Output) {
	var timer *time.Timer
	var due <-chan time.Time // set while output waits for its delivery
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	deliver := func() {
		due = nil
		if o := s.stdout.take(false); o != "" {
			out(agentapi.EventStdout, o)
		}
		if e := s.stderr.take(false); e != "" {
			out(agentapi.EventStderr, e)
		}
	}
	for {
		no, cho := s.stdout.avail()
		ne, che := s.stderr.avail()
		switch {
		case no+ne >= streamChunk:
			deliver()
			continue
		case no+ne > 0 && due == nil:
			if timer == nil {
				timer = time.NewTimer(streamDelay)
			} else {
				timer.Reset(streamDelay)
			}
			due = timer.C
		}
		select {
		case <-cho:
		case <-che:
		case <-due:
			deliver()
		case <-stop:
			return
		}
	}
}

// Reseed reseeds random (and numpy.random if imported) from seed now. It
// runs in the request queue, so code queued after it sees the new seed.
func (s *Session) Reseed(ctx context.Context, seed []byte) error {
	s.SetSeed(seed)
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	return s.sendPendingSeed(ctx)
}

// SetSeed records a reseed without waiting for it: the next request to
// hold the queue (a run_code, or ApplySeed) sends it before anything else,
// so no code ever runs with the old seed. This keeps the reseed (tens of
// milliseconds of Python under emulation, right after a restore) off the
// path to READY.
func (s *Session) SetSeed(seed []byte) {
	s.seedMu.Lock()
	s.pendingSeed = append([]byte(nil), seed...)
	s.seedMu.Unlock()
}

// ApplySeed sends a pending reseed, if any, when the queue is free.
func (s *Session) ApplySeed(ctx context.Context) error {
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	return s.sendPendingSeed(ctx)
}

// sendPendingSeed runs the pending reseed; the caller holds sem.
func (s *Session) sendPendingSeed(ctx context.Context) error {
	s.seedMu.Lock()
	seed := s.pendingSeed
	s.pendingSeed = nil
	s.seedMu.Unlock()
	if seed == nil {
		return nil
	}
	r, _, err := s.call(ctx, map[string]any{"op": "reseed", "seed": hex.EncodeToString(seed)}, 0)
	s.stdout.take(true) // nothing of the user's belongs to a reseed; keep it
	s.stderr.take(true) // from landing in the next request either way
	if err == nil && r.Error != nil {
		err = fmt.Errorf("reseeding Python: %s: %s", r.Error.Name, r.Error.Value)
	}
	if err != nil {
		// Code must never run with the template's seed in a child: a
		// session that cannot be reseeded is killed.
		s.kill("it could not be reseeded")
		return fmt.Errorf("reseeding the Python session (killed it): %w", err)
	}
	return nil
}

func (s *Session) acquire(ctx context.Context) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the Python session: %w", ctx.Err())
	}
	if !s.Alive() {
		<-s.sem
		return s.DeadError()
	}
	return nil
}

func (s *Session) release() { <-s.sem }

// call sends one request and waits for its response and its output
// markers. ctx ending or the timeout interrupts the code; call still waits
// for the response (or kills the process) so the protocol stays in step.
func (s *Session) call(ctx context.Context, req map[string]any, timeout time.Duration) (response, bool, error) {
	id := s.nextID
	s.nextID++
	req["id"] = id
	line, err := json.Marshal(req)
	if err != nil {
		return response{}, false, err
	}
	if _, err := s.reqW.Write(append(line, '\n')); err != nil {
		return response{}, false, s.deadOr(fmt.Errorf("sending to the Python session: %w", err))
	}

	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	ctxDone := ctx.Done()
	interrupted := false
	var retry <-chan time.Time
	tries := 0
	interrupt := func() {
		// A consumer that holds the output back must not keep the
		// interrupted code (or the runner's markers) from writing.
		s.unhold()
		tries++
		if tries > 3 {
			s.kill("it ignored interrupts after its timeout")
			return
		}
		_ = s.proc.KillGroup(unix.SIGINT)
		retry = time.After(s.cfg.InterruptGrace)
	}
	for {
		select {
		case r, ok := <-s.resps:
			if !ok {
				// fd 4 closed: the process is exiting, or user code closed
				// the channel; either way the session cannot go on.
				select {
				case <-s.proc.Done():
				case <-time.After(2 * time.Second):
					s.kill("its protocol channel was closed")
				}
				return response{}, interrupted, s.drainDead()
			}
			if r.ID != id {
				continue // a stale answer; cannot happen while calls are serialized
			}
			// The code is done: read what is left up to the markers now,
			// however far a streamed request's consumer lags.
			s.unhold()
			// Both markers follow the flushes that precede the response;
			// they are normally already read.
			dl := time.Now().Add(5 * time.Second)
			s.stdout.waitMark(id, dl)
			s.stderr.waitMark(id, dl)
			return r, interrupted, nil
		case <-s.proc.Done():
			return response{}, interrupted, s.drainDead()
		case <-deadline:
			deadline = nil
			interrupted = true
			interrupt()
		case <-ctxDone:
			ctxDone = nil
			if !interrupted {
				interrupted = true
				interrupt()
			}
		case <-retry:
			interrupt()
		}
	}
}

// drainDead reads what a process that is exiting wrote before it died (up
// to EOF of both pipes, a second at most) and returns its DeadError, whose
// stderr tail and the output a streamed request still delivers need it.
// Both ways a call learns of a death (the response channel closing, the
// process exiting) come here: the first can be seen before the pipes are
// read to their end.
func (s *Session) drainDead() error {
	s.unhold()
	dl := time.Now().Add(time.Second)
	s.stdout.waitMark(1<<62, dl)
	s.stderr.waitMark(1<<62, dl)
	return s.DeadError()
}

func (s *Session) deadOr(err error) error {
	if !s.Alive() {
		return s.DeadError()
	}
	return err
}
