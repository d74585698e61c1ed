package handler_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// A terminal exec's fds 0-2 are a tty of the asked size, TERM defaults,
// and the streams are merged into stdout.
func TestPTYExecSeesATerminal(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{
		Shell: `test -t 0 && test -t 1 && test -t 2 && stty size && echo "term=$TERM" && echo err >&2; exit 3`,
		PTY:   &agentapi.PTY{Rows: 24, Cols: 80},
	}, nil)
	ev := b.wait(t)
	if ev.ExitCode != 3 || ev.Signal != "" {
		t.Fatalf("exit: %+v (output %q)", ev, b.out.String())
	}
	// A terminal ends lines with CRLF (onlcr).
	if got, want := b.out.String(), "24 80\r\nterm=xterm-256color\r\nerr\r\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}

	// TERM from the request wins; the pid leads its own session.
	b = e.startExec(t, agentapi.ExecRequest{
		Shell: `echo "$TERM $(cut -d' ' -f6 /proc/$$/stat)"`,
		Env:   map[string]string{"TERM": "vt100"},
		PTY:   &agentapi.PTY{Rows: 5, Cols: 20},
	}, nil)
	if ev := b.wait(t); ev.ExitCode != 0 {
		t.Fatalf("exit: %+v", ev)
	}
	fields := strings.Fields(b.out.String())
	if len(fields) != 2 || fields[0] != "vt100" || fields[1] != strconv.Itoa(b.pid) {
		t.Fatalf("output %q, want TERM vt100 and session id %d", b.out.String(), b.pid)
	}
}

// Input types into the terminal; a resize changes what stty reports; the
// end of input is ^D, which ends cat while the shell runs on.
func TestPTYResizeAndInput(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{
		Shell:     `stty size; read x; stty size; cat; echo "done $x"`,
		PTY:       &agentapi.PTY{Rows: 24, Cols: 80},
		StdinOpen: true,
	}, nil)
	testutil.WaitFor(t, "the first stty size", func() bool { return strings.Contains(b.out.String(), "24 80\r\n") })
	if err := e.c.Resize(ctxT(t), b.pid, agentapi.ResizeRequest{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("hello\r"), false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "stty size after the resize", func() bool { return strings.Contains(b.out.String(), "50 132\r\n") })
	// close=1: ^D ends cat; the shell goes on and exits by itself.
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("line\r"), true); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.ExitCode != 0 {
		t.Fatalf("exit: %+v (output %q)", ev, b.out.String())
	}
	out := b.out.String()
	// "hello" and "line" are echoed by the terminal, cat repeats "line".
	for _, want := range []string{"hello\r\n", "line\r\nline\r\n", "done hello\r\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output %q lacks %q", out, want)
		}
	}
	if strings.Index(out, "50 132") < strings.Index(out, "hello") {
		t.Fatalf("the second stty size came before the input: %q", out)
	}
}

// Input that ends mid-line is submitted, then ended: a single ^D would
// only hand cat the partial line and leave it reading.
func TestPTYEndOfInputMidLine(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{
		Shell:     `cat; echo "after cat"`,
		PTY:       &agentapi.PTY{Rows: 24, Cols: 80},
		StdinOpen: true,
	}, nil)
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("partial"), true); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.ExitCode != 0 || !strings.Contains(b.out.String(), "after cat\r\n") {
		t.Fatalf("exit: %+v, output %q", ev, b.out.String())
	}
}

// 0x03 typed into the terminal interrupts its foreground process.
func TestPTYInterrupt(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{
		Argv:      []string{"sleep", "300"},
		PTY:       &agentapi.PTY{Rows: 24, Cols: 80},
		StdinOpen: true,
	}, nil)
	if err := e.c.WriteStdin(ctxT(t), b.pid, strings.NewReader("\x03"), false); err != nil {
		t.Fatal(err)
	}
	if ev := b.wait(t); ev.Signal != "SIGINT" || ev.ExitCode != 130 {
		t.Fatalf("exit: %+v, want SIGINT (130)", ev)
	}
}

// A terminal exec without input gets EOF at once, as /dev/null would give.
func TestPTYWithoutInputReadsEOF(t *testing.T) {
	e := newEnv(t)
	b := e.startExec(t, agentapi.ExecRequest{Shell: `cat; echo after`, PTY: &agentapi.PTY{Rows: 24, Cols: 80}}, nil)
	if ev := b.wait(t); ev.ExitCode != 0 || !strings.Contains(b.out.String(), "after\r\n") {
		t.Fatalf("exit: %+v, output %q", ev, b.out.String())
	}
}

func TestPTYErrors(t *testing.T) {
	e := newEnv(t)
	for _, size := range []agentapi.PTY{{Rows: 0, Cols: 80}, {Rows: 24, Cols: 0}, {Rows: -1, Cols: 80}, {Rows: 24, Cols: 1001}} {
		_, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Argv: []string{"true"}, PTY: &size}, nil, nil, nil)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "want 1..1000") {
			t.Fatalf("size %+v: %v, want invalid_argument naming the range", size, err)
		}
	}
	// Resizing a process without a terminal, or with a bad size.
	b := e.startExec(t, agentapi.ExecRequest{Argv: []string{"cat"}, StdinOpen: true}, nil)
	if err := e.c.Resize(ctxT(t), b.pid, agentapi.ResizeRequest{Rows: 10, Cols: 10}); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "has no terminal") {
		t.Fatalf("resize without a terminal: %v", err)
	}
	if err := e.c.WriteStdin(ctxT(t), b.pid, nil, true); err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	p := e.startExec(t, agentapi.ExecRequest{Argv: []string{"cat"}, StdinOpen: true, PTY: &agentapi.PTY{Rows: 2, Cols: 2}}, nil)
	if err := e.c.Resize(ctxT(t), p.pid, agentapi.ResizeRequest{Rows: 10, Cols: 1001}); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "pty cols 1001: want 1..1000") {
		t.Fatalf("bad resize: %v", err)
	}
	if err := e.c.Signal(ctxT(t), p.pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	if err := e.c.Resize(ctxT(t), p.pid, agentapi.ResizeRequest{Rows: 10, Cols: 10}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("resize after the exit: %v", err)
	}
}
