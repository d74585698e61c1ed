package integration

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// hostTTY is bin/forkd running on a host terminal the test types into, as
// a user's shell would run it.
type hostTTY struct {
	t      *testing.T
	master *os.File
	out    testutil.SyncBuffer
	exited chan int // the exit code, once forkd exited
}

// ttyDeadline bounds each wait for the guest: TCG on a loaded machine is
// slow, and a wait ends as soon as its condition holds.
const ttyDeadline = 3 * time.Minute

func (c *cli) startTTY(rows, cols uint16, args ...string) *hostTTY {
	c.t.Helper()
	cmd := c.cmd(args...)
	master, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		c.t.Fatal(err)
	}
	h := &hostTTY{t: c.t, master: master, exited: make(chan int, 1)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			h.out.Write(buf[:n])
			if err != nil {
				return // EIO once forkd and its children closed the terminal
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		h.exited <- code
	}()
	c.t.Cleanup(func() {
		cmd.Process.Kill()
		master.Close()
	})
	return h
}

// waitFor waits until cond holds of the output so far.
func (h *hostTTY) waitFor(what string, cond func(out string) bool) {
	h.t.Helper()
	deadline := time.Now().Add(ttyDeadline)
	for !cond(h.out.String()) {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s; the terminal shows:\n%q", what, h.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *hostTTY) waitText(s string) {
	h.t.Helper()
	h.waitFor(strconv.Quote(s), func(out string) bool { return strings.Contains(out, s) })
}

// raw reports whether forkd put the host terminal in raw mode (TCGETS on
// the master reads the terminal's settings).
func (h *hostTTY) raw() bool {
	tio, err := unix.IoctlGetTermios(int(h.master.Fd()), unix.TCGETS)
	return err == nil && tio.Lflag&(unix.ICANON|unix.ISIG|unix.ECHO) == 0
}

func (h *hostTTY) waitRaw() {
	h.t.Helper()
	deadline := time.Now().Add(ttyDeadline)
	for !h.raw() {
		if time.Now().After(deadline) {
			h.t.Fatalf("forkd never put the terminal in raw mode; it shows:\n%q", h.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *hostTTY) typ(s string) {
	h.t.Helper()
	if _, err := h.master.Write([]byte(s)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *hostTTY) wait() int {
	h.t.Helper()
	select {
	case code := <-h.exited:
		return code
	case <-time.After(ttyDeadline):
		h.t.Fatalf("forkd did not exit; the terminal shows:\n%q", h.out.String())
		return -1
	}
}

// TestInteractiveTerminal drives `forkd shell` and `forkd exec -it` from a
// real host terminal into a real guest: typed commands run, the guest's
// terminal follows a host resize, Ctrl-C interrupts the guest's
// foreground process, the exit code comes back, and the host terminal is
// restored.
func TestInteractiveTerminal(t *testing.T) {
	c := newCLI(t)
	tag := "it-pty-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
		t.Fatalf("fork: %+v %v", fr, err)
	}
	id := fr.Sandboxes[0].ID

	sh := c.startTTY(24, 80, "shell", id)
	sh.waitRaw()
	// The guest computes what it prints: the typed line (echoed) does not
	// contain the answer.
	sh.typ("echo typed-$((6*7))\r")
	sh.waitText("typed-42")
	sh.typ("stty size\r")
	sh.waitText("24 80")
	if err := pty.Setsize(sh.master, &pty.Winsize{Rows: 40, Cols: 123}); err != nil {
		t.Fatal(err)
	}
	// SIGWINCH reaches forkd asynchronously: ask until the guest agrees.
	deadline := time.Now().Add(ttyDeadline)
	for asked := 0; !strings.Contains(sh.out.String(), "40 123"); asked++ {
		if time.Now().After(deadline) {
			t.Fatalf("the guest terminal did not follow the resize:\n%q", sh.out.String())
		}
		before := strings.Count(sh.out.String(), "rows-are")
		sh.typ("echo rows-are; stty size\r")
		sh.waitFor("the answer to stty size", func(out string) bool { return strings.Count(out, "rows-are") >= before+2 })
	}
	sh.typ("exit 3\r")
	if code := sh.wait(); code != 3 {
		t.Fatalf("shell exit code %d, want 3; terminal:\n%q", code, sh.out.String())
	}
	if sh.raw() {
		t.Fatal("the host terminal was left in raw mode")
	}

	// Ctrl-C is a byte for the guest's terminal, which interrupts sleep:
	// forkd exits 128+SIGINT, as docker does.
	sl := c.startTTY(24, 80, "exec", "-it", id, "--", "sleep", "1000")
	sl.waitRaw() // the process runs: forkd goes raw after the start
	sl.typ("\x03")
	if code := sl.wait(); code != 130 {
		t.Fatalf("sleep after ^C: exit %d, want 130; terminal:\n%q", code, sl.out.String())
	}
	if sl.raw() {
		t.Fatal("the host terminal was left in raw mode after ^C")
	}

	// A terminal asked of a sandbox that is gone: a plain error, the
	// terminal never left cooked mode.
	c.ok("kill", id)
	dead := c.startTTY(24, 80, "shell", id)
	if code := dead.wait(); code == 0 {
		t.Fatalf("shell into a killed sandbox exited 0:\n%q", dead.out.String())
	}
	dead.waitText(id)
	if dead.raw() {
		t.Fatal("the host terminal was left in raw mode after the error")
	}
}
