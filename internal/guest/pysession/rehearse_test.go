package pysession

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func rehearse(m *Manager, code string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return m.Rehearse(ctx, agentapi.RehearseRequest{Code: code, TimeoutMillis: timeout.Milliseconds()})
}

// A rehearsal runs its code against the session's state, in a copy: what
// the copy changes, prints or draws is gone, and the session answers its
// next request as if nothing had run.
func TestRehearsalLeavesTheSessionAsItWas(t *testing.T) {
	m := newManager(t)
	run(t, m, "x = 1\nimport random\nrandom.seed(1)\n41", 0) // _ is 41
	code := "x = 2\ny = 3\nprint('noise')\nimport sys\nprint('more noise', file=sys.stderr)\nrandom.random()\nx"
	if err := rehearse(m, code, 0); err != nil {
		t.Fatalf("rehearse: %v", err)
	}
	// The copy runs against the session's state: it fails exactly when
	// that state says so.
	if err := rehearse(m, "assert _ == 41 and x == 1", 0); err != nil {
		t.Fatalf("the copy did not see the session's state: %v", err)
	}
	if err := rehearse(m, "assert _ != 41", 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a failing assertion in the copy: %v", err)
	}
	res := run(t, m, "print(x, 'y' in globals(), _)\nrandom.random()", 0)
	if res.Stdout != "1 False 41\n" || res.Stderr != "" {
		t.Fatalf("session changed by the rehearsal: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	// random.seed(1)'s first draw: the copy's draw was its own.
	if got := text(res); got != "0.13436424411240122" {
		t.Fatalf("random state changed by the rehearsal: %s", got)
	}
}

// The copy may not write files: Landlock refuses it every write.
func TestRehearsalCannotWriteFiles(t *testing.T) {
	if abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1); errno != 0 || abi < 1 {
		t.Skipf("this kernel has no Landlock (%v)", errno)
	}
	m := newManager(t)
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{
		"open(" + pyString(filepath.Join(dir, "new")) + ", 'w')",
		"open(" + pyString(victim) + ", 'w')",
		"import os; os.remove(" + pyString(victim) + ")",
		"import os; os.mkdir(" + pyString(filepath.Join(dir, "d")) + ")",
	} {
		err := rehearse(m, code, 0)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "raised an error") {
			t.Fatalf("%s: %v", code, err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if data, err := os.ReadFile(victim); err != nil || string(data) != "kept" || len(entries) != 1 {
		t.Fatalf("a rehearsal changed the file system: %q, %v, %d entries", data, err, len(entries))
	}
	// The session itself still writes.
	if res := run(t, m, "open("+pyString(filepath.Join(dir, "mine"))+", 'w').write('x')", 0); res.Error != nil {
		t.Fatalf("the session lost its writes: %+v", res.Error)
	}
}

func TestRehearsalFailureLeavesTheSession(t *testing.T) {
	m := newManager(t)
	run(t, m, "x = 7", 0)
	err := rehearse(m, "1/0", 0)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "raised an error") {
		t.Fatalf("failing rehearsal: %v", err)
	}
	// Past its timeout the copy is killed, even one that ignores SIGINT;
	// the session is never interrupted for it.
	for _, code := range []string{"while True: pass", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"} {
		start := time.Now()
		err = rehearse(m, code, 300*time.Millisecond)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "stopped at its deadline") {
			t.Fatalf("%q past its timeout: %v", code, err)
		}
		if d := time.Since(start); d > time.Minute {
			t.Fatalf("took %v to stop the rehearsal", d)
		}
	}
	if res := run(t, m, "x", 0); text(res) != "7" {
		t.Fatalf("after failed rehearsals: %+v", res)
	}
}

func TestRehearsalWithoutSession(t *testing.T) {
	m := NewManager(Config{Dir: t.TempDir()})
	if err := rehearse(m, "1", 0); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("rehearse without a session: %v", err)
	}
}

// pyString quotes s as a Python string literal.
func pyString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
