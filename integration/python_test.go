package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// TestPythonSession forks children of a template whose Python session was
// warmed before the snapshot: state from the warm-up is there, variables
// persist, errors carry tracebacks, timeouts keep the session, and siblings'
// random generators were reseeded apart.
func TestPythonSession(t *testing.T) {
	e := newEngine(t, 1)
	snap := newTemplate(t, e, "py-min")
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 2)
	if err != nil {
		t.Fatal(err)
	}
	a0, a1 := agentOf(t, e, sbs[0].ID), agentOf(t, e, sbs[1].ID)

	code := func(a interface {
		RunCode(context.Context, agentapi.RunCodeRequest) (agentapi.RunCodeResult, error)
	}, src string, timeout time.Duration) agentapi.RunCodeResult {
		t.Helper()
		res, err := a.RunCode(ctx, agentapi.RunCodeRequest{Code: src, TimeoutMillis: timeout.Milliseconds()})
		if err != nil {
			t.Fatalf("run_code %q: %v", src, err)
		}
		return res
	}
	if r := code(a0, "warmed", 0); r.Result["text/plain"] != "'yes'" {
		t.Fatalf("warm-up state missing: %+v", r)
	}
	code(a0, "x = 41", 0)
	if r := code(a0, "print('out'); x + 1", 0); r.Result["text/plain"] != "42" || r.Stdout != "out\n" {
		t.Fatalf("persistence/last expression: %+v", r)
	}
	if r := code(a1, "'x' in globals()", 0); r.Result["text/plain"] != "False" {
		t.Fatalf("sibling sees x: %+v", r)
	}
	r := code(a0, "1/0", 0)
	if r.Error == nil || r.Error.Name != "ZeroDivisionError" || !strings.Contains(r.Error.Traceback, "ZeroDivisionError") {
		t.Fatalf("exception: %+v", r.Error)
	}
	r = code(a0, "while True: pass", 1500*time.Millisecond)
	if !r.TimedOut {
		t.Fatalf("timeout not reported: %+v", r)
	}
	if r := code(a0, "x", 0); r.Result["text/plain"] != "41" {
		t.Fatalf("session lost after timeout: %+v", r)
	}
	// random was seeded before the snapshot; each child was reseeded.
	r0 := code(a0, "random.random()", 0).Result["text/plain"]
	r1 := code(a1, "random.random()", 0).Result["text/plain"]
	if r0 == "" || r0 == r1 {
		t.Fatalf("siblings drew the same random number %q / %q", r0, r1)
	}
	// The streamed variant delivers output and then the result.
	var out, errb strings.Builder
	res, err := a0.RunCodeStream(ctx, agentapi.RunCodeRequest{Code: "for i in range(3): print(i)\nx * 2"}, &out, &errb)
	if err != nil || out.String() != "0\n1\n2\n" || res.Result["text/plain"] != "82" {
		t.Fatalf("run_code stream: %v out %q result %+v", err, out.String(), res)
	}
	if err := snap.Verify(); err != nil {
		t.Fatal(err)
	}
}
