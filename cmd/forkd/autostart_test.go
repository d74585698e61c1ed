package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/jail"
)

// TestMain lets the test binary stand in for a daemon: with
// FORKD_TEST_FAKE_SERVE set it waits for SIGTERM, its command line naming
// the serve subcommand, as `forkd serve` does. With
// FORKD_TEST_FAKE_SERVE_SOCKET also set, it starts answering /v1/healthz on
// that socket after half a second, as a daemon does once it has adopted
// its sandboxes.
//
// With FORKD_TEST_CLI set, it is forkd itself: the arguments are a forkd
// command line (for processes forkd starts of itself, like the bench
// watchdog).
func TestMain(m *testing.M) {
	jail.Main()
	if os.Getenv("FORKD_TEST_CLI") != "" {
		root := newRootCmd(&globals{})
		root.SetArgs(os.Args[1:])
		if err := root.Execute(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("FORKD_TEST_FAKE_SERVE") != "" {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		if sock := os.Getenv("FORKD_TEST_FAKE_SERVE_SOCKET"); sock != "" {
			go func() {
				time.Sleep(500 * time.Millisecond)
				ln, err := net.Listen("unix", sock)
				if err != nil {
					os.Exit(3)
				}
				http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.Write([]byte(`{"status":"ok"}`))
				}))
			}()
		}
		os.Stdout.WriteString("ready\n")
		select {
		case <-c:
		case <-time.After(time.Minute):
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func startProcess(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if cmd.Env != nil { // the fake daemon says when its handler is in place
		buf := make([]byte, 6)
		if _, err := out.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	return cmd
}

func stopGlobals(t *testing.T, pidFile string) *globals {
	dir := t.TempDir()
	g := &globals{runDir: dir, socket: filepath.Join(dir, "none.sock")}
	if pidFile != "" {
		os.WriteFile(g.pidPath(), []byte(pidFile), 0o600)
	}
	return g
}

func TestDaemonStopLeavesUnrelatedProcess(t *testing.T) {
	// kill -9 left the pid file; its pid now belongs to something else.
	sleep := startProcess(t, exec.Command("sleep", "60"))
	g := stopGlobals(t, strconv.Itoa(sleep.Process.Pid)+"\n")
	pid, stopped, msg, err := stopDaemon(g, 5*time.Second)
	if err != nil || stopped || pid != 0 {
		t.Fatalf("stop: pid %d stopped %v err %v", pid, stopped, err)
	}
	if !strings.Contains(msg, "removed the stale pid file") || !strings.Contains(msg, "not a forkd daemon") {
		t.Fatalf("message %q", msg)
	}
	if _, err := os.Stat(g.pidPath()); !os.IsNotExist(err) {
		t.Fatalf("stale pid file kept: %v", err)
	}
	if err := syscall.Kill(sleep.Process.Pid, 0); err != nil {
		t.Fatalf("the unrelated process was signalled: %v", err)
	}
}

func TestDaemonStopStalePidFiles(t *testing.T) {
	gone := exec.Command("true")
	gone.Run()
	for _, content := range []string{strconv.Itoa(gone.Process.Pid), "garbage"} {
		g := stopGlobals(t, content)
		_, stopped, msg, err := stopDaemon(g, time.Second)
		if err != nil || stopped || !strings.Contains(msg, "removed the stale pid file") {
			t.Errorf("pid file %q: stopped %v, %q, %v", content, stopped, msg, err)
		}
	}
	g := stopGlobals(t, "")
	if _, _, msg, err := stopDaemon(g, time.Second); err != nil || msg != "forkd daemon is not running" {
		t.Errorf("no pid file: %q, %v", msg, err)
	}
}

// TestDaemonStopStopsDaemon: also on a kernel without pidfd_open (before
// 5.3, or a seccomp filter refusing it), where the daemon gets kill(2)
// after the same identity check and its exit is polled.
func TestDaemonStopStopsDaemon(t *testing.T) {
	for _, withPidfd := range []bool{true, false} {
		t.Run(fmt.Sprintf("pidfd=%v", withPidfd), func(t *testing.T) {
			if !withPidfd {
				pidfdOpen = func(int, int) (int, error) { return -1, unix.ENOSYS }
				t.Cleanup(func() { pidfdOpen = unix.PidfdOpen })
			}
			// The test binary's name starts with forkd (forkd.test) and
			// "serve" is in its command line: it passes for a daemon.
			self, _ := os.Executable()
			cmd := exec.Command(self, "-test.run=^$", "serve")
			cmd.Env = append(os.Environ(), "FORKD_TEST_FAKE_SERVE=1")
			d := startProcess(t, cmd)
			g := stopGlobals(t, strconv.Itoa(d.Process.Pid))
			pid, stopped, msg, err := stopDaemon(g, time.Minute) // bounds a hang only
			if err != nil || !stopped || pid != d.Process.Pid || msg != "forkd daemon stopped" {
				t.Fatalf("stop: pid %d stopped %v %q %v", pid, stopped, msg, err)
			}
		})
	}
	if err := checkDaemonProcess(os.Getpid()); err == nil {
		t.Fatal("this test process (no serve argument) passed for a daemon")
	}
}

// TestStartWaitsForAStartingDaemon: a daemon whose pid file is written
// but whose socket does not answer yet (adopting its sandboxes) is waited
// for; no second daemon is started.
func TestStartWaitsForAStartingDaemon(t *testing.T) {
	self, _ := os.Executable()
	g := stopGlobals(t, "")
	cmd := exec.Command(self, "-test.run=^$", "serve")
	cmd.Env = append(os.Environ(), "FORKD_TEST_FAKE_SERVE=1", "FORKD_TEST_FAKE_SERVE_SOCKET="+g.socketPath())
	d := startProcess(t, cmd)
	os.WriteFile(g.pidPath(), []byte(strconv.Itoa(d.Process.Pid)+"\n"), 0o600)
	if err := g.startDaemon(context.Background()); err != nil {
		t.Fatalf("start while one is starting: %v", err)
	}
	if pid := socketPeerPID(g.socketPath()); pid != d.Process.Pid {
		t.Fatalf("the socket is served by pid %d, want the starting daemon %d", pid, d.Process.Pid)
	}
	if _, err := os.Stat(g.logPath()); !os.IsNotExist(err) {
		t.Errorf("a daemon was started (its log exists): %v", err)
	}
}

// Only a command line that runs serve is a daemon's: not one where "serve"
// is an argument of another command, a flag's value, or the name of a
// guest program.
func TestForkdSubcommand(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"forkd", "serve"}, "serve"},
		{[]string{"/usr/bin/forkd", "serve", "--data-dir", "/d", "--socket", "/s"}, "serve"},
		{[]string{"forkd", "--data-dir", "/d", "--json", "serve"}, "serve"},
		{[]string{"forkd.test", "-test.run=^$", "serve"}, "serve"},
		{[]string{"forkd", "--run-dir", "/r", "bench", "watchdog", "--owner", "1"}, "bench watchdog"},
		{[]string{"forkd", "exec", "sb-1", "--", "npm", "run", "serve"}, "exec"},
		{[]string{"forkd", "--data-dir", "serve", "ls"}, "ls"},
		{[]string{"forkd", "exec", "sb-1", "serve"}, "exec"},
		{[]string{"forkd"}, ""},
		{[]string{"forkd", "no-such", "serve"}, ""},
	} {
		if got := forkdSubcommand(c.argv); got != c.want {
			t.Errorf("%q: %q, want %q", c.argv, got, c.want)
		}
	}
}

// A forkd CLI process with "serve" among its arguments (an exec of a
// guest `npm run serve`) that took a stale pid file's pid is not stopped.
func TestDaemonStopLeavesForkdClientWithServeArgument(t *testing.T) {
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$", "exec", "sb-1", "--", "npm", "run", "serve")
	cmd.Env = append(os.Environ(), "FORKD_TEST_FAKE_SERVE=1")
	p := startProcess(t, cmd)
	g := stopGlobals(t, strconv.Itoa(p.Process.Pid))
	pid, stopped, msg, err := stopDaemon(g, time.Second)
	if err != nil || stopped || pid != 0 || !strings.Contains(msg, "not a forkd daemon") {
		t.Fatalf("stop: pid %d stopped %v %q %v", pid, stopped, msg, err)
	}
	// Still running, not a zombie that took the SIGTERM.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if _, rest, _ := strings.Cut(string(stat), ") "); !strings.HasPrefix(rest, "S") && !strings.HasPrefix(rest, "R") {
		t.Fatalf("the client process was signalled: %s", stat)
	}
}

// daemon status exits 1 when no daemon answers, with --json as without
// (stdout still carries the status).
func TestDaemonStatusExitCode(t *testing.T) {
	dir := t.TempDir()
	for _, asJSON := range []bool{false, true} {
		args := []string{"--run-dir", dir, "daemon", "status"}
		if asJSON {
			args = append([]string{"--json"}, args...)
		}
		out, err := runCLI(t, nil, args...)
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 1 {
			t.Errorf("json %v: %v, want exit 1", asJSON, err)
		}
		if asJSON {
			var st struct {
				Running bool   `json:"running"`
				Error   string `json:"error"`
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil || st.Running || st.Error == "" {
				t.Errorf("status --json: %v\n%s", err, out)
			}
		}
	}
}
