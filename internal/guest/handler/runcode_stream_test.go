package handler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// timedWriter records when each write arrived.
type timedWriter struct {
	mu     sync.Mutex
	writes []time.Time
	b      strings.Builder
	first  chan struct{} // closed on the first write
}

func newTimedWriter() *timedWriter { return &timedWriter{first: make(chan struct{})} }

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.writes) == 0 {
		close(w.first)
	}
	w.writes = append(w.writes, time.Now())
	return w.b.Write(p)
}

func (w *timedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func pythonEnv(t *testing.T, warm string) *env {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	e := newEnv(t)
	if _, err := e.c.StartPython(ctxT(t), agentapi.PythonStartRequest{Warm: warm}); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRunCodeStreamOverTheWire(t *testing.T) {
	e := pythonEnv(t, "base = 40")
	ctx := ctxT(t)
	out, errw := newTimedWriter(), newTimedWriter()
	// The code goes on past its first line only once the test has seen
	// that line: it was streamed, however slow the machine.
	gate := filepath.Join(t.TempDir(), "gate")
	type result struct {
		res agentapi.RunCodeResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e.c.RunCodeStream(ctx, agentapi.RunCodeRequest{
			Code: fmt.Sprintf("import os, time, sys\nfor i in range(3):\n    print(i)\n"+
				"    while i == 0 and not os.path.exists(%q): time.sleep(0.01)\n"+
				"    time.sleep(0.3)\nprint('warn', file=sys.stderr)\nbase + 2", gate),
		}, out, errw)
		done <- result{res, err}
	}()
	select {
	case <-out.first:
	case r := <-done:
		t.Fatalf("the code ended before its first line arrived: %+v %v", r.res, r.err)
	}
	if got := out.String(); got != "0\n" {
		t.Fatalf("first output %q", got)
	}
	os.WriteFile(gate, nil, 0o644)
	r := <-done
	res, err := r.res, r.err
	if err != nil || res.Result["text/plain"] != "42" || res.Error != nil || res.TimedOut || res.DurationMicros < 800_000 {
		t.Fatalf("result: %+v %v", res, err)
	}
	if res.Stdout != "" || res.Stderr != "" {
		t.Fatalf("the result repeats the streamed output: %+v", res)
	}
	if out.String() != "0\n1\n2\n" || errw.String() != "warn\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errw.String())
	}

	// Exceptions and timeouts are results; the session lives on.
	var buf strings.Builder
	res, err = e.c.RunCodeStream(ctx, agentapi.RunCodeRequest{Code: "print('before')\n1/0"}, &buf, nil)
	if err != nil || res.Error == nil || res.Error.Name != "ZeroDivisionError" || buf.String() != "before\n" {
		t.Fatalf("exception: %+v %v %q", res, err, buf.String())
	}
	out = newTimedWriter()
	start := time.Now()
	// A timeout of seconds: the three lines are printed before it on a
	// loaded machine too. The loop would run for hours.
	res, err = e.c.RunCodeStream(ctx, agentapi.RunCodeRequest{
		Code: "import time\nfor i in range(100000):\n    print(i)\n    time.sleep(0.1)", TimeoutMillis: 3000,
	}, out, nil)
	if err != nil || !res.TimedOut || res.Error == nil || res.Error.Name != "TimeoutError" || time.Since(start) > 30*time.Second {
		t.Fatalf("timeout: %+v %v after %v", res, err, time.Since(start))
	}
	if !strings.HasPrefix(out.String(), "0\n1\n2\n") || len(out.writes) < 2 {
		t.Fatalf("output before the timeout: %q in %d writes", out.String(), len(out.writes))
	}
	if res, err := e.c.RunCode(ctx, agentapi.RunCodeRequest{Code: "base"}); err != nil || res.Result["text/plain"] != "40" {
		t.Fatalf("after timeout: %+v %v", res, err)
	}
}

func TestRunCodeStreamWithoutSession(t *testing.T) {
	e := newEnv(t)
	_, err := e.c.RunCodeStream(ctxT(t), agentapi.RunCodeRequest{Code: "1"}, nil, nil)
	var pe *agentclient.ProblemError
	if !errdefs.IsFailedPrecondition(err) || !errors.As(err, &pe) || !strings.Contains(err.Error(), "no Python session in this sandbox") {
		t.Fatalf("%v", err)
	}
}

// A host that goes away interrupts the code; the session serves the next
// call at once.
func TestRunCodeStreamCancelInterrupts(t *testing.T) {
	e := pythonEnv(t, "")
	ctx, cancel := context.WithCancel(ctxT(t))
	out := newTimedWriter()
	errc := make(chan error, 1)
	go func() {
		_, err := e.c.RunCodeStream(ctx, agentapi.RunCodeRequest{Code: "import time\nfor i in range(1000000):\n    print(i)\n    time.sleep(0.05)\nfinished = True"}, out, nil)
		errc <- err
	}()
	select {
	case <-out.first:
	case <-time.After(time.Minute):
		t.Fatal("no output")
	}
	cancel()
	if err := <-errc; !errors.Is(err, errdefs.ErrCanceled) {
		t.Fatalf("canceled call: %v", err)
	}
	start := time.Now()
	res, err := e.c.RunCode(ctxT(t), agentapi.RunCodeRequest{Code: "'finished' in globals()"})
	if err != nil || res.Result["text/plain"] != "False" {
		t.Fatalf("after cancel: %+v %v", res, err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the next call waited %v: the code was not interrupted", d)
	}
}

// Streamed and buffered calls share one queue.
func TestRunCodeStreamIsSerialized(t *testing.T) {
	e := pythonEnv(t, "n = 0")
	ctx := ctxT(t)
	out := newTimedWriter()
	done := make(chan error, 1)
	go func() {
		_, err := e.c.RunCodeStream(ctx, agentapi.RunCodeRequest{Code: "import time\nprint('go')\nv = n\ntime.sleep(0.5)\nn = v + 1"}, out, nil)
		done <- err
	}()
	select {
	case <-out.first: // the streamed code runs
	case err := <-done:
		t.Fatalf("the streamed code ended without output: %v", err)
	}
	res, err := e.c.RunCode(ctx, agentapi.RunCodeRequest{Code: "n = n + 10\nn"})
	if err != nil || res.Result["text/plain"] != "11" {
		t.Fatalf("queued call saw %+v %v, want 11 (it must wait for the stream)", res, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A new host's reseed is applied before streamed code runs too.
func TestRunCodeStreamAfterReseed(t *testing.T) {
	e := pythonEnv(t, "import random")
	drawStream := func() string {
		res, err := e.c.RunCodeStream(ctxT(t), agentapi.RunCodeRequest{Code: "random.random()"}, nil, nil)
		if err != nil || res.Error != nil {
			t.Fatalf("draw: %+v %v", res, err)
		}
		return res.Result["text/plain"]
	}
	e.connect("child-1", entropy(11))
	a := drawStream()
	e.connect("child-2", entropy(22))
	b := drawStream()
	e.connect("child-1-again", entropy(11))
	res, err := e.c.RunCode(ctxT(t), agentapi.RunCodeRequest{Code: "random.random()"})
	if err != nil {
		t.Fatal(err)
	}
	if a == b || res.Result["text/plain"] != a {
		t.Fatalf("draws %s %s %s: the reseed is not applied before streamed code", a, b, res.Result["text/plain"])
	}
}

// A session that dies while the code runs ends the stream with an error
// event: the output before it arrives, and the error keeps its class.
func TestRunCodeStreamSessionDeath(t *testing.T) {
	e := pythonEnv(t, "")
	var out strings.Builder
	_, err := e.c.RunCodeStream(ctxT(t), agentapi.RunCodeRequest{Code: "import os, sys\nprint('last words')\nsys.stderr.write('dying\\n'); sys.stderr.flush()\nos._exit(3)"}, &out, nil)
	var pe *agentclient.ProblemError
	if !errdefs.IsFailedPrecondition(err) || !errors.As(err, &pe) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("%v", err)
	}
	if out.String() != "last words\n" {
		t.Fatalf("stdout %q", out.String())
	}
}

// The wire format: NDJSON, data as a JSON string, one final result line.
func TestRunCodeStreamWireFormat(t *testing.T) {
	e := pythonEnv(t, "")
	resp, err := e.sess.HTTPClient().Post(agentconn.BaseURL+agentapi.PathRunCodeStream, "application/json",
		strings.NewReader(`{"code":"print('héllo')\n6*7"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 2 || lines[0] != `{"type":"stdout","data":"héllo\n"}` ||
		!strings.HasPrefix(lines[1], `{"type":"result","result":{"stdout":"","stderr":"","result":{"text/plain":"42"},"duration_us":`) {
		t.Fatalf("stream:\n%s", b)
	}
}
