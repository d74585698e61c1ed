package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func awaitGlobals(t *testing.T, log string) *globals {
	t.Helper()
	dir := t.TempDir()
	g := &globals{runDir: dir, socket: filepath.Join(dir, "d.sock")}
	if log != "" {
		if err := os.WriteFile(g.logPath(), []byte(log), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// startSleep starts a process that stands in for a daemon that never
// answers. It is reaped only at the end of the test: once killed, it stays
// a zombie, as a daemon does until its parent reaps it.
func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// awaitFor runs awaitDaemon and fails the test unless it returns within
// limit, far below daemonStartWait.
func awaitFor(t *testing.T, g *globals, pid int, exited <-chan struct{}, limit time.Duration) error {
	t.Helper()
	res := make(chan error, 1)
	start := time.Now()
	go func() { res <- g.awaitDaemon(context.Background(), pid, exited, "daemon (pid %d) answers") }()
	select {
	case err := <-res:
		t.Logf("awaitDaemon returned after %v: %v", time.Since(start), err)
		return err
	case <-time.After(limit):
		t.Fatalf("awaitDaemon still waiting after %v", limit)
		return nil
	}
}

// A daemon that exits while starting is reported at once, with its log,
// not after the (long) wait for a slow daemon: the daemon this CLI started
// (its exit is seen by Wait), and one found starting (its pid is polled),
// whether its parent has reaped it yet or not. The old poll, kill(pid, 0),
// took a zombie for a running daemon.
func TestAwaitDaemonReturnsWhenTheDaemonExits(t *testing.T) {
	if daemonStartWait < time.Minute {
		t.Fatalf("daemonStartWait is %v; a daemon adopting many sandboxes on a busy host needs longer", daemonStartWait)
	}
	const log = "forkd: state lock held by another daemon"
	check := func(t *testing.T, g *globals, err error) {
		t.Helper()
		if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "exited at start") ||
			!strings.Contains(err.Error(), log) || !strings.Contains(err.Error(), g.logPath()) {
			t.Fatalf("got %v, want the daemon's exit with its log", err)
		}
	}
	t.Run("child", func(t *testing.T) {
		g := awaitGlobals(t, log)
		p := startSleep(t)
		exited := make(chan struct{})
		time.AfterFunc(200*time.Millisecond, func() { close(exited) })
		check(t, g, awaitFor(t, g, p.Process.Pid, exited, 20*time.Second))
	})
	t.Run("zombie", func(t *testing.T) {
		g := awaitGlobals(t, log)
		p := startSleep(t)
		time.AfterFunc(200*time.Millisecond, func() { p.Process.Signal(syscall.SIGKILL) })
		check(t, g, awaitFor(t, g, p.Process.Pid, nil, 20*time.Second))
	})
	t.Run("reaped", func(t *testing.T) {
		g := awaitGlobals(t, log)
		p := exec.Command("sleep", "0.2")
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		reaped := make(chan struct{})
		go func() { p.Wait(); close(reaped) }()
		t.Cleanup(func() { p.Process.Kill(); <-reaped })
		check(t, g, awaitFor(t, g, p.Process.Pid, nil, 20*time.Second))
	})
}

// A daemon that runs but does not answer in time: the error says so and
// where its log is, with the log's end. One that accepts connections but
// never answers cannot hold the wait past its limit.
func TestAwaitDaemonTimeoutSaysWhereTheLogIs(t *testing.T) {
	old := daemonStartWait
	daemonStartWait = 500 * time.Millisecond
	t.Cleanup(func() { daemonStartWait = old })
	const log = "forkd: adopting sandbox sb-17"

	for _, accepts := range []bool{false, true} {
		g := awaitGlobals(t, log)
		if accepts {
			ln, err := net.Listen("unix", g.socketPath())
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var conns []net.Conn // held open, never answered
			t.Cleanup(func() {
				ln.Close()
				mu.Lock()
				defer mu.Unlock()
				for _, c := range conns {
					c.Close()
				}
			})
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			}()
		}
		p := startSleep(t)
		err := awaitFor(t, g, p.Process.Pid, nil, 20*time.Second)
		if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "did not answer") ||
			!strings.Contains(err.Error(), g.logPath()) || !strings.Contains(err.Error(), log) {
			t.Fatalf("accepts %v: got %v, want a timeout naming the log", accepts, err)
		}
	}

	g := awaitGlobals(t, "") // no log yet: its path still
	p := startSleep(t)
	if err := awaitFor(t, g, p.Process.Pid, nil, 20*time.Second); err == nil || !strings.Contains(err.Error(), g.logPath()) {
		t.Fatalf("no log: got %v, want its path", err)
	}
}
