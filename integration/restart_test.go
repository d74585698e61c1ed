package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

func (c *cli) daemonPID() int {
	data, _ := os.ReadFile(filepath.Join(c.runDir, "forkd.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// waitGone waits until pid has exited. A zombie counts as gone: its
// parent (init, in a container maybe one that reaps late) may not have
// reaped it yet.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if st, err := procfs.ReadStat(pid); err != nil || st.Exited() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDaemonRestart: the daemon is killed with -9 (also in the middle of a
// fork) and stopped with SIGTERM; each time the next daemon re-adopts every
// sandbox it reported, marks the one whose VMM died meanwhile as dead, and
// leaves no VMM without an owner.
func TestDaemonRestart(t *testing.T) {
	c := newCLI(t)
	tag := "it-restart-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	var fr apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "-n", "3", "--json")), &fr)
	if len(fr.Sandboxes) != 3 {
		t.Fatalf("fork: %+v", fr)
	}
	for _, s := range fr.Sandboxes {
		c.ok("exec", s.ID, "--", "sh", "-c", "echo kept-"+s.ID+" > /tmp/keep")
	}

	// kill -9 in the middle of a fork of 10, once it is really in flight:
	// some of its children are ready (listed), not all of them.
	var forkOut bytes.Buffer
	fork := c.cmd("fork", "--tag", tag, "-n", "10", "--json")
	fork.Stdout = &forkOut
	if err := fork.Start(); err != nil {
		t.Fatal(err)
	}
	forkDone := make(chan struct{})
	go func() { fork.Wait(); close(forkDone) }()
	inFlight := false
	deadline := time.Now().Add(2 * time.Minute)
	for !inFlight && time.Now().Before(deadline) {
		select {
		case <-forkDone:
			deadline = time.Now() // it answered before it was seen in flight
		default:
		}
		var sbs []apiv1.Sandbox
		out, _, code := c.run("--no-autostart", "ls", "--json")
		if code == 0 && json.Unmarshal([]byte(out), &sbs) == nil && len(sbs) > len(fr.Sandboxes) {
			inFlight = true
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	pid := c.daemonPID()
	syscall.Kill(pid, syscall.SIGKILL)
	waitGone(t, pid)
	<-forkDone
	// What the interrupted fork reported, if it answered after all.
	var reported apiv1.ForkResponse
	json.Unmarshal(forkOut.Bytes(), &reported)
	t.Logf("fork seen in flight: %v; it reported %d sandboxes", inFlight, len(reported.Sandboxes))
	if !inFlight && len(reported.Sandboxes) == 0 {
		t.Fatal("the fork of 10 was never seen in flight and reported nothing")
	}
	// While no daemon runs, one child's VMM dies.
	victim := fr.Sandboxes[2]
	syscall.Kill(victim.PID, syscall.SIGKILL)
	waitGone(t, victim.PID)

	c.ok("daemon", "start")
	check := func(when string) {
		t.Helper()
		sbs := c.sandboxes()
		byID := map[string]apiv1.Sandbox{}
		running := 0
		for _, s := range sbs {
			byID[s.ID] = s
			if s.State == apiv1.StateRunning {
				running++
			}
		}
		for _, s := range fr.Sandboxes[:2] {
			got, ok := byID[s.ID]
			if !ok || got.State != apiv1.StateRunning {
				t.Fatalf("%s: reported sandbox %s is %+v", when, s.ID, got)
			}
			if out := c.ok("exec", s.ID, "--", "cat", "/tmp/keep"); out != "kept-"+s.ID+"\n" {
				t.Fatalf("%s: sandbox %s lost its state: %q", when, s.ID, out)
			}
		}
		// Of the interrupted fork, what it reported is adopted and
		// usable; a child it never reported is killed and forgotten. The
		// fork's children are committed together, so a fork killed just
		// after its commit (before its answer reached the client) leaves
		// all ten, never some.
		interrupted := 0
		for _, s := range sbs {
			if s.ID != victim.ID && s.ID != fr.Sandboxes[0].ID && s.ID != fr.Sandboxes[1].ID {
				interrupted++
			}
		}
		if interrupted != len(reported.Sandboxes) && !(len(reported.Sandboxes) == 0 && interrupted == 10) {
			t.Fatalf("%s: %d sandboxes of the interrupted fork listed, it reported %d", when, interrupted, len(reported.Sandboxes))
		}
		for _, s := range reported.Sandboxes {
			if got, ok := byID[s.ID]; !ok || got.State != apiv1.StateRunning {
				t.Fatalf("%s: reported sandbox %s of the interrupted fork is %+v", when, s.ID, got)
			}
			if out := c.ok("exec", s.ID, "--", "echo", "ok"); out != "ok\n" {
				t.Fatalf("%s: sandbox %s of the interrupted fork: %q", when, s.ID, out)
			}
		}
		// No VMM is left without an owner: every QEMU under the run dir
		// is a running sandbox or a pooled VMM.
		var snap apiv1.Snapshot
		deadline := time.Now().Add(3 * time.Minute) // the pool refills under TCG
		for {
			json.Unmarshal([]byte(c.ok("snapshot", "info", tag, "--json")), &snap)
			if c.vmmProcesses() == running+snap.Pooled {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d VMM processes for %d running sandboxes and %d pooled", when, c.vmmProcesses(), running, snap.Pooled)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	check("after kill -9")
	dead := c.sandboxes()
	for _, s := range dead {
		if s.ID == victim.ID && (s.State != apiv1.StateDead || !strings.Contains(s.DeadReason, "daemon was down")) {
			t.Fatalf("VMM killed while the daemon was down: %+v", s)
		}
	}

	// SIGTERM: graceful; sandboxes keep running and are re-adopted.
	pid = c.daemonPID()
	c.ok("daemon", "stop")
	waitGone(t, pid)
	if syscall.Kill(fr.Sandboxes[0].PID, 0) != nil {
		t.Fatal("a sandbox VMM stopped with the daemon")
	}
	c.ok("daemon", "start")
	check("after SIGTERM")
}

// TestDaemonSIGTERM: `serve --stop-sandboxes` stops every VMM when it gets
// SIGTERM, and lets a request in flight finish first: an exec that is
// sleeping when the signal arrives still delivers its output and exit.
func TestDaemonSIGTERM(t *testing.T) {
	c := newCLI(t)
	var serveLog bytes.Buffer
	serve := c.cmd("serve", "--stop-sandboxes")
	serve.Stdout, serve.Stderr = &serveLog, &serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			serve.Process.Kill()
			<-served
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, _, code := c.run("--no-autostart", "ls"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("forkd serve --stop-sandboxes did not answer within 2m:\n%s", serveLog.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	tag := "it-sigterm-" + snapshot.NewID()
	c.ok("--no-autostart", "snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	var fr apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("--no-autostart", "fork", "--tag", tag, "-n", "2", "--json")), &fr)
	if len(fr.Sandboxes) != 2 {
		t.Fatalf("fork: %+v", fr)
	}
	id := fr.Sandboxes[0].ID

	// An exec that is mid-sleep when SIGTERM arrives.
	var execOut, execErr bytes.Buffer
	exec := c.cmd("--no-autostart", "exec", id, "--", "sh", "-c", "touch /tmp/started; sleep 2; echo done")
	exec.Stdout, exec.Stderr = &execOut, &execErr
	if err := exec.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, _, code := c.run("--no-autostart", "exec", id, "--", "test", "-e", "/tmp/started"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec did not start within 2m")
		}
	}
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := exec.Wait(); err != nil || execOut.String() != "done\n" {
		t.Fatalf("exec in flight at SIGTERM: %v, stdout %q, stderr %q", err, execOut.String(), execErr.String())
	}
	select {
	case err := <-served:
		stopped = true
		if err != nil {
			t.Fatalf("forkd serve after SIGTERM: %v\n%s", err, serveLog.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("forkd serve still running 2m after SIGTERM:\n%s", serveLog.String())
	}
	for _, s := range fr.Sandboxes {
		waitGone(t, s.PID)
	}
	if n := c.vmmProcesses(); n != 0 {
		t.Fatalf("%d VMM processes left by serve --stop-sandboxes", n)
	}
	// The next daemon has nothing to adopt.
	if sbs := c.sandboxes(); len(sbs) != 0 {
		t.Fatalf("sandboxes after a daemon that stopped them: %+v", sbs)
	}
}
