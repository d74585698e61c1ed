package reaper

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Status is how a process ended.
type Status struct {
	Pid        int
	WaitStatus unix.WaitStatus
	Rusage     unix.Rusage
}

// ExitCode is the exit status of an exited process, or 128+signal for one
// killed by a signal (the shell convention).
func (s Status) ExitCode() int {
	switch {
	case s.WaitStatus.Exited():
		return s.WaitStatus.ExitStatus()
	case s.WaitStatus.Signaled():
		return 128 + int(s.WaitStatus.Signal())
	}
	return -1
}

// Signal is the name of the signal that killed the process ("SIGKILL"), or
// "" if it exited.
func (s Status) Signal() string {
	if !s.WaitStatus.Signaled() {
		return ""
	}
	if name := unix.SignalName(s.WaitStatus.Signal()); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", int(s.WaitStatus.Signal()))
}

func (s Status) String() string {
	if sig := s.Signal(); sig != "" {
		return "killed by " + sig
	}
	return fmt.Sprintf("exit status %d", s.ExitCode())
}

// Reaper reaps children and dispatches their exit statuses.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan Status
	orphans int // orphans reaped (pids nobody registered)
}

var (
	defaultOnce sync.Once
	defaultR    *Reaper
)

// Default returns the process's reaper, starting it on first use. There is
// only one: SIGCHLD and wait4(-1) are process-wide.
func Default() *Reaper {
	defaultOnce.Do(func() {
		defaultR = &Reaper{waiters: make(map[int]chan Status)}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, unix.SIGCHLD)
		go defaultR.loop(ch)
	})
	return defaultR
}

// BecomeSubreaper makes orphans of this process's descendants reparent to
// it (PR_SET_CHILD_SUBREAPER), as they would to PID 1. Tests and a
// non-PID-1 agent use it so orphan reaping behaves as in the VM.
func BecomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

func (r *Reaper) loop(sigs <-chan os.Signal) {
	// SIGCHLDs coalesce, so every wake-up reaps until nothing is left. The
	// ticker is a safety net for a signal lost to a race with Notify.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
		case <-tick.C:
		}
		r.reapAll()
	}
}

func (r *Reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var st Status
		pid, err := unix.Wait4(-1, &st.WaitStatus, unix.WNOHANG, &st.Rusage)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: no children; 0: none exited
			return
		}
		// Stopped/continued children are not reported without WUNTRACED /
		// WCONTINUED, so every pid here has ended.
		st.Pid = pid
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- st // buffered
		} else {
			r.orphans++
		}
	}
}

// Orphans returns how many processes were reaped that nobody waited for.
func (r *Reaper) Orphans() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.orphans
}

// Process is a child started through the reaper.
type Process struct {
	Pid  int
	r    *Reaper
	done chan Status
	st   Status
	fin  chan struct{}
}

// Start starts argv0 with argv and attr (see syscall.ForkExec) and
// registers it before the reaper can reap it. Use attr.Sys.Setpgid to give
// the process its own group, so KillGroup reaches its descendants.
func (r *Reaper) Start(argv0 string, argv []string, attr *syscall.ProcAttr) (*Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return nil, err
	}
	p := &Process{Pid: pid, r: r, done: make(chan Status, 1), fin: make(chan struct{})}
	r.waiters[pid] = p.done
	go func() {
		p.st = <-p.done
		close(p.fin)
	}()
	return p, nil
}

// Done is closed when the process has ended and been reaped.
func (p *Process) Done() <-chan struct{} { return p.fin }

// Wait blocks until the process has ended and returns its status.
func (p *Process) Wait() Status {
	<-p.fin
	return p.st
}

// Signal sends sig to the process, unless it has been reaped already (its
// pid may then belong to another process).
func (p *Process) Signal(sig unix.Signal) error {
	// Under the reaper's lock the pid cannot be reaped (and reused) between
	// the check and the kill.
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	if _, ok := p.r.waiters[p.Pid]; !ok {
		return os.ErrProcessDone
	}
	return unix.Kill(p.Pid, sig)
}

// SignalGroup sends sig to the process group led by the process (started
// with Setpgid), unless the leader has been reaped: until then its pid, the
// group's id, cannot be reused, so the signal cannot reach another exec's
// group. A group whose leader was reaped gets os.ErrProcessDone (KillGroup
// still reaches what it left running).
func (p *Process) SignalGroup(sig unix.Signal) error {
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	if _, ok := p.r.waiters[p.Pid]; !ok {
		return os.ErrProcessDone
	}
	err := unix.Kill(-p.Pid, sig)
	if err == unix.ESRCH {
		return os.ErrProcessDone
	}
	return err
}

// KillGroup sends sig to the process group led by the process (started with
// Setpgid). The group may outlive its leader: background children of a
// shell keep it, so this works after the leader has exited too.
func (p *Process) KillGroup(sig unix.Signal) error {
	err := unix.Kill(-p.Pid, sig)
	if err == unix.ESRCH {
		return os.ErrProcessDone
	}
	return err
}
