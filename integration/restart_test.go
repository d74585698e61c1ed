package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

func (c *cli) daemonPID() int {
	data, _ := os.ReadFile(filepath.Join(c.runDir, "forkd.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for syscall.Kill(pid, 0) == nil {
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

	// kill -9 in the middle of a fork of 10.
	fork := c.cmd("fork", "--tag", tag, "-n", "10")
	if err := fork.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	pid := c.daemonPID()
	syscall.Kill(pid, syscall.SIGKILL)
	waitGone(t, pid)
	fork.Wait()
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
		// Children of the interrupted fork that were recorded before the
		// kill are adopted too; everything else was killed.
		var snap apiv1.Snapshot
		deadline := time.Now().Add(30 * time.Second)
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
