package handler_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/handler"
	"github.com/forkd-dev/forkd/internal/guest/procenv"
	"github.com/forkd-dev/forkd/internal/testutil"
)

func TestExecOutputAndExitCode(t *testing.T) {
	e := newEnv(t)
	var out, errb bytes.Buffer
	ev, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, nil, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != agentapi.EventExit || ev.ExitCode != 3 || ev.Signal != "" || ev.TimedOut || ev.DurationMicros <= 0 {
		t.Fatalf("exit event: %+v", ev)
	}
	if out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}

	out.Reset()
	ev, err = e.c.Exec(ctxT(t), agentapi.ExecRequest{Argv: []string{"printf", "%s-%s", "a b", "c"}}, nil, &out, nil)
	if err != nil || ev.ExitCode != 0 || out.String() != "a b-c" {
		t.Fatalf("argv: %+v %v %q", ev, err, out.String())
	}

	ev, err = e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: "kill -TERM $$"}, nil, nil, nil)
	if err != nil || ev.Signal != "SIGTERM" || ev.ExitCode != 143 {
		t.Fatalf("signal: %+v %v", ev, err)
	}
}

func TestExecEnvAndCwd(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	var out bytes.Buffer
	_, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{
		Shell: `echo "$FOO|$HOME|$LANG|$PATH"; pwd`,
		Env:   map[string]string{"FOO": "bar baz", "HOME": "/nonexistent"},
		Cwd:   dir,
	}, nil, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "bar baz|/nonexistent|C.UTF-8|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" + dir + "\n"
	if out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
	// The agent's own environment is not inherited.
	os.Setenv("FORKD_TEST_LEAK", "1")
	defer os.Unsetenv("FORKD_TEST_LEAK")
	out.Reset()
	e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: `echo "[$FORKD_TEST_LEAK]"`}, nil, &out, nil)
	if out.String() != "[]\n" {
		t.Fatalf("agent env leaked: %q", out.String())
	}
}

// TestExecImageDefaults: an OCI image's Env and WorkingDir (the agent's
// Env and Cwd) are the defaults of an exec; the request still wins.
func TestExecImageDefaults(t *testing.T) {
	work := t.TempDir()
	e := newEnvWith(t, func(c *handler.Config) {
		c.Env = procenv.Merge(procenv.Default, map[string]string{"GREETING": "from the image"})
		c.Cwd = work
	})
	var out bytes.Buffer
	if _, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: `echo "$GREETING"; pwd`}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	if want := "from the image\n" + work + "\n"; out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
	other := t.TempDir()
	out.Reset()
	if _, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: `echo "$GREETING"; pwd`, Cwd: other,
		Env: map[string]string{"GREETING": "from the request"}}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	if want := "from the request\n" + other + "\n"; out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}

func TestExecStdin(t *testing.T) {
	e := newEnv(t)
	in := randomBytes(3 << 20)
	var out bytes.Buffer
	ev, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(in), &out, nil)
	if err != nil || ev.ExitCode != 0 {
		t.Fatalf("cat: %+v %v", ev, err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatalf("cat returned %d bytes, want %d identical", out.Len(), len(in))
	}
	// Interactive: output arrives while stdin is still open.
	pr, pw := io.Pipe()
	got := make(chan string, 1)
	lw := &lineWriter{lines: got}
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: "while read l; do echo got:$l; done"}, pr, lw, nil)
		done <- err
	}()
	fmt.Fprintln(pw, "one")
	select {
	case l := <-got:
		if l != "got:one\n" {
			t.Fatalf("echo: %q", l)
		}
	case <-time.After(time.Minute):
		t.Fatal("no output while stdin is open")
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

type lineWriter struct{ lines chan string }

func (w *lineWriter) Write(b []byte) (int, error) {
	select {
	case w.lines <- string(b):
	default:
	}
	return len(b), nil
}

func TestExecStreamsPromptly(t *testing.T) {
	e := newEnv(t)
	// The process ends only once the test has seen its first output, so
	// that output cannot have been held back to the end, however slow the
	// machine.
	gate := filepath.Join(t.TempDir(), "gate")
	var mu sync.Mutex
	var out bytes.Buffer
	w := writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		out.Write(b)
		if strings.Contains(out.String(), "first\n") {
			os.WriteFile(gate, nil, 0o644)
		}
		return len(b), nil
	})
	ev, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{
		Shell: fmt.Sprintf("echo first; while [ ! -e %s ]; do sleep 0.01; done", gate),
	}, nil, w, nil)
	if err != nil || ev.ExitCode != 0 || out.String() != "first\n" {
		t.Fatalf("%+v %v %q (an error here means the first line was not streamed)", ev, err, out.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestExecLargeOutput(t *testing.T) {
	e := newEnv(t)
	var n countWriter
	ev, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: "head -c 8000000 /dev/zero; echo tail >&2"}, nil, &n, io.Discard)
	if err != nil || ev.ExitCode != 0 || n != 8000000 {
		t.Fatalf("%+v %v: %d bytes", ev, err, n)
	}
}

type countWriter int

func (c *countWriter) Write(b []byte) (int, error) { *c += countWriter(len(b)); return len(b), nil }

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	e := newEnv(t)
	pids := filepath.Join(t.TempDir(), "pids")
	start := time.Now()
	// The timeout leaves a loaded machine time to start both sleeps.
	ev, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{
		Shell:         fmt.Sprintf("sleep 100 & echo $! > %s; sleep 100 & echo $! >> %s; wait", pids, pids),
		TimeoutMillis: 3000,
	}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("timeout took %v", d)
	}
	if !ev.TimedOut || ev.Signal != "SIGKILL" {
		t.Fatalf("exit event: %+v", ev)
	}
	b, _ := os.ReadFile(pids)
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		t.Fatalf("pids file: %q", b)
	}
	for _, f := range fields {
		pid, _ := strconv.Atoi(f)
		testutil.WaitFor(t, fmt.Sprintf("background sleep %d to die after the timeout", pid), func() bool { return !alive(pid) })
	}
}

// alive reports whether pid runs (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func TestExecBackgroundChildDoesNotHoldTheResponse(t *testing.T) {
	e := newEnv(t)
	var out bytes.Buffer
	start := time.Now()
	// The child outlives any wait a loaded machine could cause (ctxT ends
	// the call first), so an exec that waits for it fails.
	ev, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: "sleep 300 & echo $!"}, nil, &out, nil)
	if pid, _ := strconv.Atoi(strings.TrimSpace(out.String())); pid > 0 {
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	}
	if err != nil || ev.ExitCode != 0 {
		t.Fatalf("%+v %v %q (after %v)", ev, err, out.String(), time.Since(start))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("exec waited %v for a background child holding stdout", d)
	}
}

func TestExecStartErrors(t *testing.T) {
	e := newEnv(t)
	for name, req := range map[string]agentapi.ExecRequest{
		"missing executable": {Argv: []string{"no-such-command-forkd"}},
		"missing cwd":        {Shell: "true", Cwd: "/no/such/dir"},
	} {
		_, err := e.c.Exec(ctxT(t), req, nil, nil, nil)
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s: %v, want not found", name, err)
		}
	}
	for name, req := range map[string]agentapi.ExecRequest{
		"nothing": {},
		"both":    {Argv: []string{"true"}, Shell: "true"},
		"bad env": {Shell: "true", Env: map[string]string{"A=B": "c"}},
	} {
		_, err := e.c.Exec(ctxT(t), req, nil, nil, nil)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

func TestExecCutStreamIsAnError(t *testing.T) {
	e := newEnv(t)
	sess := e.sess
	var out testutil.SyncBuffer
	var once sync.Once
	w := writerFunc(func(b []byte) (int, error) {
		out.Write(b)
		// The connection to the VM is lost mid-exec: once the output
		// shows the process runs.
		once.Do(func() { go sess.Close() })
		return len(b), nil
	})
	_, err := e.c.Exec(ctxT(t), agentapi.ExecRequest{Shell: "echo partial; sleep 100"}, nil, w, nil)
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("cut stream: %v (stdout %q), want unavailable", err, out.String())
	}
}
