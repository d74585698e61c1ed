package handler_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestRunCodeWithoutSession(t *testing.T) {
	e := newEnv(t)
	_, err := e.c.RunCode(ctxT(t), agentapi.RunCodeRequest{Code: "1"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no Python session in this sandbox") {
		t.Fatalf("%v", err)
	}
}

func TestPythonSessionOverTheWire(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	e := newEnv(t)
	ctx := ctxT(t)
	resp, err := e.c.StartPython(ctx, agentapi.PythonStartRequest{Warm: "import random\nbase = 40\nprint('warm')"})
	if err != nil || resp.Warm.Error != nil || resp.Warm.Stdout != "warm\n" {
		t.Fatalf("start: %+v %v", resp, err)
	}
	if _, err := e.c.StartPython(ctx, agentapi.PythonStartRequest{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second start: %v", err)
	}
	if info, _ := e.c.Info(ctx); !info.Python {
		t.Fatal("Info.Python is false with a session running")
	}
	res, err := e.c.RunCode(ctx, agentapi.RunCodeRequest{Code: "import os\nos.system('echo from-shell')\nprint('from-print')\nbase + 2"})
	if err != nil || res.Result["text/plain"] != "42" || res.Stdout != "from-shell\nfrom-print\n" {
		t.Fatalf("run: %+v %v", res, err)
	}
	res, err = e.c.RunCode(ctx, agentapi.RunCodeRequest{Code: "1/0"})
	if err != nil || res.Error == nil || res.Error.Name != "ZeroDivisionError" || !strings.Contains(res.Error.Traceback, "1/0") {
		t.Fatalf("exception: %+v %v", res, err)
	}
	start := time.Now()
	res, err = e.c.RunCode(ctx, agentapi.RunCodeRequest{Code: "while True: pass", TimeoutMillis: 300})
	if err != nil || !res.TimedOut || res.Error == nil || res.Error.Name != "TimeoutError" || time.Since(start) > 30*time.Second {
		t.Fatalf("timeout: %+v %v after %v", res, err, time.Since(start))
	}
	if res, _ := e.c.RunCode(ctx, agentapi.RunCodeRequest{Code: "base"}); res.Result["text/plain"] != "40" {
		t.Fatalf("after timeout: %+v", res)
	}
}

// Two children of one template must not draw the same random numbers: the
// identity of each new host (HELLO) reseeds Python before any code runs.
func TestHelloReseedsPython(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.c.StartPython(ctx, agentapi.PythonStartRequest{Warm: "import random"}); err != nil {
		t.Fatal(err)
	}
	draw := func() string {
		t.Helper()
		res, err := e.c.RunCode(ctxT(t), agentapi.RunCodeRequest{Code: "random.random()"})
		if err != nil || res.Error != nil {
			t.Fatalf("draw: %+v %v", res, err)
		}
		return res.Result["text/plain"]
	}
	// Child 1 and child 2 of the same template state: the same entropy
	// reproduces the draw, a different one changes it.
	e.connect("child-1", entropy(11))
	a := draw()
	e.connect("child-2", entropy(22))
	b := draw()
	e.connect("child-1-again", entropy(11))
	a2 := draw()
	if a == b {
		t.Fatalf("two identities drew the same random.random(): %s", a)
	}
	if a != a2 {
		t.Fatalf("the same entropy drew %s then %s: reseed is not applied", a, a2)
	}
	// SetIdentity reseeds too.
	if _, err := e.c.SetIdentity(ctx, agentapi.Identity{SandboxID: "x", Entropy: entropy(22)}); err != nil {
		t.Fatal(err)
	}
	if got := draw(); got != b {
		t.Fatalf("SetIdentity: drew %s, want %s", got, b)
	}
}
