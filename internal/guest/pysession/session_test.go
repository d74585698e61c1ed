package pysession

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// newManager starts a session whose code gets generous time to answer an
// interrupt: on a loaded machine a short grace would kill (and lose) a
// session that tests expect to survive its timeout.
func newManager(t *testing.T) *Manager {
	t.Helper()
	return newManagerGrace(t, 10*time.Second)
}

func newManagerGrace(t *testing.T, grace time.Duration) *Manager {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	m := NewManager(Config{Dir: t.TempDir(), InterruptGrace: grace})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := m.Start(ctx, agentapi.PythonStartRequest{}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(m.Close)
	return m
}

func run(t *testing.T, m *Manager, code string, timeout time.Duration) agentapi.RunCodeResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := m.Run(ctx, agentapi.RunCodeRequest{Code: code, TimeoutMillis: timeout.Milliseconds()})
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return res
}

func text(res agentapi.RunCodeResult) string { return res.Result["text/plain"] }

func TestPersistenceAndLastExpression(t *testing.T) {
	m := newManager(t)
	if res := run(t, m, "x = 41", 0); res.Error != nil || res.Result != nil || res.Stdout != "" {
		t.Fatalf("assignment: %+v", res)
	}
	if res := run(t, m, "y = x + 1\ny", 0); text(res) != "42" {
		t.Fatalf("last expression: %+v", res)
	}
	if res := run(t, m, "'a' * 3", 0); text(res) != "'aaa'" {
		t.Fatalf("repr: %+v", res)
	}
	if res := run(t, m, "None", 0); res.Result != nil {
		t.Fatalf("None gives no result: %+v", res)
	}
	if res := run(t, m, "_", 0); text(res) != "'aaa'" {
		t.Fatalf("_ holds the last value: %+v", res)
	}
}

func TestExceptions(t *testing.T) {
	m := newManager(t)
	res := run(t, m, "def f():\n    raise ValueError('boom')\n\nf()", 0)
	if res.Error == nil || res.Error.Name != "ValueError" || res.Error.Value != "boom" {
		t.Fatalf("error: %+v", res.Error)
	}
	tb := res.Error.Traceback
	if !strings.Contains(tb, "<cell-") || !strings.Contains(tb, "raise ValueError('boom')") || strings.Contains(tb, "pyrunner") {
		t.Fatalf("traceback should show the user's frames and source only:\n%s", tb)
	}
	res = run(t, m, "def broken(:\n  pass", 0)
	if res.Error == nil || res.Error.Name != "SyntaxError" {
		t.Fatalf("syntax error: %+v", res.Error)
	}
	res = run(t, m, "import sys; sys.exit(3)", 0)
	if res.Error == nil || res.Error.Name != "SystemExit" {
		t.Fatalf("sys.exit: %+v", res.Error)
	}
	if res := run(t, m, "1 + 1", 0); text(res) != "2" {
		t.Fatalf("session after exceptions: %+v", res)
	}
}

func TestOutputCapture(t *testing.T) {
	m := newManager(t)
	res := run(t, m, "import os, sys\nprint('a')\nos.system('echo hi; echo err >&2')\nprint('b', file=sys.stderr)\nprint('c', end='')", 0)
	if res.Stdout != "a\nhi\nc" || res.Stderr != "err\nb\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	// Nothing leaks into the next call.
	if res := run(t, m, "2", 0); res.Stdout != "" || res.Stderr != "" {
		t.Fatalf("leaked output: %+v", res)
	}
	// A marker look-alike in user output is passed through.
	res = run(t, m, "print('\\x1eFORKD:nottoken:1\\x1e')", 0)
	if res.Stdout != "\x1eFORKD:nottoken:1\x1e\n" {
		t.Fatalf("look-alike: %q", res.Stdout)
	}
}

func TestLargeOutputIsBounded(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	m := NewManager(Config{Dir: t.TempDir(), MaxOutput: 1 << 20})
	if _, err := m.Start(context.Background(), agentapi.PythonStartRequest{}); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	res := run(t, m, "print('x' * (3 << 20))", 0)
	if len(res.Stdout) > 1<<20+100 || !strings.Contains(res.Stdout, "more bytes of output dropped") {
		t.Fatalf("stdout len %d, tail %q", len(res.Stdout), res.Stdout[max(0, len(res.Stdout)-80):])
	}
	if res := run(t, m, "print('ok')", 0); res.Stdout != "ok\n" {
		t.Fatalf("after large output: %q", res.Stdout)
	}
}

func TestTimeoutInterruptsAndSessionSurvives(t *testing.T) {
	m := newManager(t)
	run(t, m, "x = 7", 0)
	for _, code := range []string{"while True: pass", "import time; time.sleep(100)", "import os; os.system('sleep 100')"} {
		start := time.Now()
		res := run(t, m, code, 300*time.Millisecond)
		if !res.TimedOut || res.Error == nil || res.Error.Name != "TimeoutError" {
			t.Fatalf("%q: %+v", code, res)
		}
		if d := time.Since(start); d > time.Minute {
			t.Fatalf("%q: took %v to time out", code, d)
		}
		if res := run(t, m, "x", 0); text(res) != "7" {
			t.Fatalf("after %q: variables lost: %+v", code, res)
		}
	}
}

func TestCodeIgnoringInterruptsIsKilled(t *testing.T) {
	// Code that ignores SIGINT is killed after its grace whatever the
	// machine's speed: a short one keeps the test short.
	m := newManagerGrace(t, 300*time.Millisecond)
	code := "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
	res := run(t, m, code, 200*time.Millisecond)
	if !res.TimedOut || res.Error == nil || !strings.Contains(res.Error.Value, "killed") {
		t.Fatalf("%+v", res)
	}
	_, err := m.Run(context.Background(), agentapi.RunCodeRequest{Code: "1"})
	if !errdefs.IsFailedPrecondition(err) || !errors.Is(err, ErrDead) {
		t.Fatalf("run after kill: %v", err)
	}
	if m.Running() {
		t.Fatal("Running() after kill")
	}
	if _, err := m.Start(context.Background(), agentapi.PythonStartRequest{Warm: "z = 1"}); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if res := run(t, m, "z + 1", 0); text(res) != "2" {
		t.Fatalf("restarted session: %+v", res)
	}
}

func TestDeathIsReported(t *testing.T) {
	m := newManager(t)
	_, err := m.Run(context.Background(), agentapi.RunCodeRequest{Code: "import os, sys\nsys.stderr.write('dying now\\n'); sys.stderr.flush()\nos._exit(3)"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "dying now") {
		t.Fatalf("death: %v", err)
	}
	if _, err := m.Start(context.Background(), agentapi.PythonStartRequest{}); err != nil {
		t.Fatalf("restart after death: %v", err)
	}
	if _, err := m.Start(context.Background(), agentapi.PythonStartRequest{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second start: %v", err)
	}
}

func TestNoSession(t *testing.T) {
	m := NewManager(Config{Dir: t.TempDir()})
	_, err := m.Run(context.Background(), agentapi.RunCodeRequest{Code: "1"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no Python session") {
		t.Fatalf("%v", err)
	}
	if err := m.Reseed(context.Background(), make([]byte, 32)); err != nil {
		t.Fatalf("reseed without session: %v", err)
	}
}

func TestReseed(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	draw := func(seed byte) string {
		t.Helper()
		s := make([]byte, 32)
		for i := range s {
			s[i] = seed
		}
		if err := m.Reseed(ctx, s); err != nil {
			t.Fatal(err)
		}
		return text(run(t, m, "import random; (random.random(), random.getrandbits(64))", 0))
	}
	a1, a2, b := draw(1), draw(1), draw(2)
	if a1 != a2 {
		t.Fatalf("same seed, different draws: %s %s", a1, a2)
	}
	if a1 == b {
		t.Fatalf("different seeds, same draw: %s", a1)
	}

	// numpy's global generator is reseeded when numpy is imported. The host
	// has no numpy: a stand-in module records the seed it gets.
	run(t, m, "import sys, types\nseeds = []\nnp = types.ModuleType('numpy')\nnp.random = types.SimpleNamespace(seed=seeds.append)\nsys.modules['numpy'] = np", 0)
	draw(3)
	got := text(run(t, m, "len(seeds), len(seeds[0]), all(0 <= w < 2**32 for w in seeds[0])", 0))
	if got != "(1, 8, True)" {
		t.Fatalf("numpy.random.seed calls: %s, want one call with 8 uint32 words", got)
	}
}

// Siblings restored from one template share tempfile's name sequence (its
// generator is replaced only when the pid changes, which a restored VM's
// does not): the reseed must give it the new entropy too, also for a
// reference to the sequence taken before.
func TestReseedTempfileNames(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	run(t, m, "import tempfile\nseq = tempfile._get_candidate_names()\nnext(seq)", 0)
	names := func(seed byte) string {
		t.Helper()
		if err := m.Reseed(ctx, bytes.Repeat([]byte{seed}, 32)); err != nil {
			t.Fatal(err)
		}
		return text(run(t, m, "[next(seq) for _ in range(4)], next(tempfile._get_candidate_names())", 0))
	}
	a1, a2, b := names(1), names(1), names(2)
	if a1 != a2 {
		t.Fatalf("same seed, different temp names: %s %s", a1, a2)
	}
	if a1 == b {
		t.Fatalf("different seeds (siblings), same temp names: %s", a1)
	}
	// Still a working tempfile afterwards.
	if got := text(run(t, m, "import os\nfd, p = tempfile.mkstemp(prefix='forkd-'); os.close(fd); os.unlink(p); os.path.basename(p).startswith('forkd-')", 0)); got != "True" {
		t.Fatalf("mkstemp after reseed: %s", got)
	}
}

func TestConcurrentCallsQueue(t *testing.T) {
	m := newManager(t)
	run(t, m, "n = 0", 0)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Not atomic if two ran at once: read, sleep, write.
			res := run(t, m, fmt.Sprintf("import time\nv = n\ntime.sleep(0.02)\nn = v + 1\nprint(%d)", i), 0)
			if res.Stdout != fmt.Sprintf("%d\n", i) {
				t.Errorf("call %d got stdout %q", i, res.Stdout)
			}
		}()
	}
	wg.Wait()
	if res := run(t, m, "n", 0); text(res) != "8" {
		t.Fatalf("n = %s, want 8 (calls overlapped)", text(res))
	}
}

func TestCancelInterrupts(t *testing.T) {
	m := newManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := m.Run(ctx, agentapi.RunCodeRequest{Code: "while True: pass"})
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("canceled run: %v", err)
	}
	if res := run(t, m, "3", 0); text(res) != "3" {
		t.Fatalf("after cancel: %+v", res)
	}
}

// TestRichOutput checks the MIME bundles of values (IPython's _repr_*_
// protocol), display() and open matplotlib figures. matplotlib is not on
// the host, so a stand-in pyplot module with its calls (get_fignums,
// figure, close, Figure.savefig) plays it; the guest image test with the
// real one is in integration.
func TestRichOutput(t *testing.T) {
	m := newManager(t)
	res := run(t, m, `
class Table:
    def __repr__(self): return "Table()"
    def _repr_html_(self): return "<table></table>"
    def _repr_png_(self): return b"\x89PNG"
    def _repr_svg_(self): raise ValueError("no svg")
Table()`, 0)
	if res.Error != nil || res.Result["text/plain"] != "Table()" || res.Result["text/html"] != "<table></table>" ||
		res.Result["image/png"] != "iVBORw==" {
		t.Fatalf("bundle: %+v", res)
	}
	if _, ok := res.Result["image/svg+xml"]; ok {
		t.Errorf("a failing _repr_svg_ gave svg: %+v", res.Result)
	}
	res = run(t, m, `
import sys, types
class Fig:
    def __init__(self, n): self.n = n
    def __repr__(self): return "<Figure %d>" % self.n
    def savefig(self, buf, format, bbox_inches): buf.write(b"png-%d" % self.n)
figs = {1: Fig(1), 2: Fig(2)}
plt = types.ModuleType("matplotlib.pyplot")
plt.get_fignums = lambda: sorted(figs)
plt.figure = lambda n: figs[n]
plt.close = lambda which: figs.clear()
sys.modules["matplotlib.pyplot"] = plt
display(Table(), 7)
"value"`, 0)
	if res.Error != nil || res.Result["text/plain"] != "'value'" || len(res.Display) != 4 {
		t.Fatalf("display: %+v", res)
	}
	want := []map[string]string{
		{"text/plain": "Table()", "text/html": "<table></table>", "image/png": "iVBORw=="},
		{"text/plain": "7"},
		{"text/plain": "<Figure 1>", "image/png": "cG5nLTE="},
		{"text/plain": "<Figure 2>", "image/png": "cG5nLTI="},
	}
	for i, w := range want {
		for k, v := range w {
			if res.Display[i][k] != v || len(res.Display[i]) != len(w) {
				t.Errorf("display[%d] = %v, want %v", i, res.Display[i], w)
				break
			}
		}
	}
	// Figures were closed: the next cell shows nothing; an error keeps what
	// was displayed before it.
	if res := run(t, m, "1", 0); len(res.Display) != 0 {
		t.Errorf("figures shown twice: %+v", res.Display)
	}
	res = run(t, m, "display('before'); 1/0", 0)
	if res.Error == nil || len(res.Display) != 1 || res.Display[0]["text/plain"] != "'before'" {
		t.Errorf("display before an error: %+v", res)
	}
}
