package handler_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// bgExec is an exec running in the background of a test.
type bgExec struct {
	pid  int
	out  *testutil.SyncBuffer
	done chan execOutcome
}

type execOutcome struct {
	ev  agentapi.ExecEvent
	err error
}

// startExec runs req in the background and returns once the agent reported
// the process started.
func (e *env) startExec(t *testing.T, req agentapi.ExecRequest, stdin io.Reader) *bgExec {
	t.Helper()
	b := &bgExec{out: &testutil.SyncBuffer{}, done: make(chan execOutcome, 1)}
	started := make(chan int, 1)
	go func() {
		ev, err := e.c.ExecStarted(ctxT(t), req, stdin, func(pid int) { started <- pid }, b.out, io.Discard)
		b.done <- execOutcome{ev, err}
	}()
	select {
	case b.pid = <-started:
	case o := <-b.done:
		t.Fatalf("exec %+v ended before it started: %+v %v", req, o.ev, o.err)
	}
	if b.pid <= 0 {
		t.Fatalf("exec reported pid %d", b.pid)
	}
	return b
}

func (b *bgExec) wait(t *testing.T) agentapi.ExecEvent {
	t.Helper()
	o := <-b.done
	if o.err != nil {
		t.Fatalf("exec: %v", o.err)
	}
	return o.ev
}

func (e *env) listed(t *testing.T, pid int) (agentapi.ProcessInfo, bool) {
	t.Helper()
	list, err := e.c.Processes(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if p.Pid == pid {
			return p, true
		}
	}
	return agentapi.ProcessInfo{}, false
}

func TestExecReportsItsPid(t *testing.T) {
	e := newEnv(t)
	var got int
	var out bytes.Buffer
	ev, err := e.c.ExecStarted(ctxT(t), agentapi.ExecRequest{Shell: "echo $$"}, nil, func(pid int) { got = pid }, &out, nil)
	if err != nil || ev.ExitCode != 0 {
		t.Fatalf("%+v %v", ev, err)
	}
	if want, _ := strconv.Atoi(strings.TrimSpace(out.String())); got != want || got <= 0 {
		t.Fatalf("started(pid=%d), the shell says its pid is %q", got, out.String())
	}
	// Gone from the table once it exited.
	if p, ok := e.listed(t, got); ok {
		t.Fatalf("exited process still listed: %+v", p)
	}
}

func TestStdinOpenWriteListClose(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	b := e.startExec(t, agentapi.ExecRequest{Argv: []string{"cat"}, Cwd: dir, StdinOpen: true}, nil)

	info, ok := e.listed(t, b.pid)
	if !ok || !info.StdinOpen || !slices.Equal(info.Argv, []string{"cat"}) || info.Cwd != dir || info.Started.IsZero() {
		t.Fatalf("listed %+v (found %v)", info, ok)
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("one\n"), false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "cat to echo the first write", func() bool { return b.out.String() == "one\n" })
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("two\n"), true); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.ExitCode != 0 || b.out.String() != "one\ntwo\n" {
		t.Fatalf("cat: %+v, output %q", ev, b.out.String())
	}
	if _, ok := e.listed(t, b.pid); ok {
		t.Fatal("exited process still listed")
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("late"), false); !errdefs.IsNotFound(err) {
		t.Fatalf("write to an exited process: %v, want not found", err)
	}
	if err := e.c.Signal(ctxT(t), b.pid, "SIGTERM"); !errdefs.IsNotFound(err) {
		t.Fatalf("signal to an exited process: %v, want not found", err)
	}
}

func TestStdinClosedOrNotKeptOpen(t *testing.T) {
	e := newEnv(t)
	// Neither StdinOpen nor a body: stdin is /dev/null.
	b := e.startExec(t, agentapi.ExecRequest{Argv: []string{"sleep", "100"}}, nil)
	if info, _ := e.listed(t, b.pid); info.StdinOpen {
		t.Fatalf("listed with stdin open: %+v", info)
	}
	err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("x"), false)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "stdin_open") {
		t.Fatalf("write to a process without stdin_open: %v, want failed precondition naming stdin_open", err)
	}
	if err := e.c.Signal(ctxT(t), b.pid, ""); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.Signal != "SIGKILL" {
		t.Fatalf("default signal: %+v, want SIGKILL", ev)
	}

	// Closed: writes are refused, closing again is fine.
	b = e.startExec(t, agentapi.ExecRequest{Shell: "cat; sleep 100", StdinOpen: true}, nil)
	if err := e.c.WriteStdin(ctxT(t), b.pid, nil, true); err != nil {
		t.Fatal(err)
	}
	if info, _ := e.listed(t, b.pid); info.StdinOpen {
		t.Fatalf("listed with stdin open after close: %+v", info)
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("x"), false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("write after close: %v, want failed precondition", err)
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, nil, true); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := e.c.Signal(ctxT(t), b.pid, "term"); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.ExitCode != 143 {
		t.Fatalf("after SIGTERM to the group: %+v", ev)
	}
}

func TestSignalErrors(t *testing.T) {
	e := newEnv(t)
	if err := e.c.Signal(ctxT(t), 999999, "SIGTERM"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown pid: %v, want not found", err)
	}
	b := e.startExec(t, agentapi.ExecRequest{Argv: []string{"sleep", "100"}}, nil)
	if err := e.c.Signal(ctxT(t), b.pid, "SIGNOPE"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("unknown signal: %v, want invalid argument", err)
	}
	if err := e.c.Signal(ctxT(t), b.pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	b.wait(t)
}

func TestSignalReachesTheGroup(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{Shell: "sleep 100 & echo $!; wait"}, nil)
	testutil.WaitFor(t, "the child's pid", func() bool { return strings.HasSuffix(b.out.String(), "\n") })
	child, _ := strconv.Atoi(strings.TrimSpace(b.out.String()))
	if err := e.c.Signal(ctxT(t), b.pid, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	testutil.WaitFor(t, "the background child to die", func() bool { return !alive(child) })
}

func TestStdinBodyThenKeptOpen(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{Argv: []string{"cat"}, StdinOpen: true}, strings.NewReader("from the body\n"))
	testutil.WaitFor(t, "the body's bytes", func() bool { return b.out.String() == "from the body\n" })
	// The body's EOF did not close stdin.
	if info, _ := e.listed(t, b.pid); !info.StdinOpen {
		t.Fatalf("stdin closed at the body's end: %+v", info)
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("then more\n"), true); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.ExitCode != 0 || b.out.String() != "from the body\nthen more\n" {
		t.Fatalf("%+v %q", ev, b.out.String())
	}
}

// Concurrent writers to one stdin each get their bytes in whole, and many
// processes are written at once over the one session.
func TestConcurrentStdinWriters(t *testing.T) {
	e := newEnv(t)
	const procs, writers, size = 3, 6, 200 << 10
	var execs []*bgExec
	for range procs {
		execs = append(execs, e.startExec(t, agentapi.ExecRequest{Argv: []string{"cat"}, StdinOpen: true}, nil))
	}
	var wg sync.WaitGroup
	for _, b := range execs {
		for i := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				block := bytes.Repeat([]byte{byte('a' + i)}, size)
				if err := e.c.WriteStdin(ctxT(t), b.pid, bytes.NewReader(block), false); err != nil {
					t.Errorf("writer %d to %d: %v", i, b.pid, err)
				}
			}()
		}
	}
	wg.Wait()
	for _, b := range execs {
		if err := e.c.WriteStdin(ctxT(t), b.pid, nil, true); err != nil {
			t.Fatal(err)
		}
		b.wait(t)
		out := b.out.String()
		if len(out) != writers*size {
			t.Fatalf("process %d echoed %d bytes, want %d", b.pid, len(out), writers*size)
		}
		// Each request's bytes are contiguous: the output is writers runs
		// of one letter each.
		runs := 0
		for i := 0; i < len(out); i++ {
			if i == 0 || out[i] != out[i-1] {
				runs++
			}
		}
		if runs != writers {
			t.Fatalf("process %d: %d runs of letters, want %d (requests interleaved)", b.pid, runs, writers)
		}
	}
}

// A write to a process that does not read blocks on the full pipe (nothing
// piles up in the agent) until the request ends; the process's exit frees
// a writer too.
func TestStdinWriteToProcessThatDoesNotRead(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{Argv: []string{"sleep", "100"}, StdinOpen: true}, nil)
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := e.c.WriteStdin(short, b.pid, bytes.NewReader(make([]byte, 4<<20)), false)
	if err == nil {
		t.Fatal("4 MiB written to a process that never reads")
	}
	// The pipe is still usable after the abandoned write: a later request
	// blocks again, and is released by the exit.
	res := make(chan error, 1)
	go func() { res <- e.c.WriteStdin(ctxT(t), b.pid, bytes.NewReader(make([]byte, 4<<20)), false) }()
	if err := e.c.Signal(ctxT(t), b.pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	if err := <-res; err == nil || !(errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err)) {
		t.Fatalf("write blocked when the process died: %v, want failed precondition or not found", err)
	}
}

// The exit event comes after the process left the table: a host that read
// it and then lists, writes or signals never finds the exited process
// (its watcher goroutine removing it races the exit event otherwise).
func TestExitedProcessUnlistedBeforeExitEvent(t *testing.T) {
	e := newEnv(t)
	for i := range 200 {
		var pid int
		ev, err := e.c.ExecStarted(ctxT(t), agentapi.ExecRequest{Argv: []string{"true"}, StdinOpen: true}, nil, func(p int) { pid = p }, io.Discard, io.Discard)
		if err != nil || ev.ExitCode != 0 {
			t.Fatalf("exec %d: %+v %v", i, ev, err)
		}
		if p, ok := e.listed(t, pid); ok {
			t.Fatalf("exec %d: listed after its exit event: %+v", i, p)
		}
	}
}
