package integration

import (
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestLiveBranch runs a daemon with --live-branch (memory images on tmpfs,
// QEMU allowed a userfaultfd): a live branch forks like any tag; a no-wait
// live branch is "writing" and then "ready"; and the daemon killed with -9
// in the middle of one leaves the source running (QEMU finishes writing a
// spool nobody reads instead of freezing the guest) and the tag absent,
// or complete and forkable, never torn.
func TestLiveBranch(t *testing.T) {
	memDir := "/dev/shm/forkd-it-" + snapshot.NewID()
	t.Cleanup(func() { os.RemoveAll(memDir) })
	c := newCLI(t)
	c.env = append(c.env, "FORKD_LIVE_BRANCH=1", "FORKD_MEMORY_DIR="+memDir)
	id := snapshot.NewID()
	tag := "it-live-" + id
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	t.Cleanup(func() { c.run("rmi", "--cascade", tag) })
	var fr apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr)
	if len(fr.Sandboxes) != 1 {
		t.Fatalf("fork: %+v", fr)
	}
	src := fr.Sandboxes[0].ID
	c.ok("exec", src, "--", "sh", "-c", "echo before > /root/state")

	var br apiv1.BranchResponse
	live1 := "it-live-b1-" + id
	json.Unmarshal([]byte(c.ok("branch", src, "--tag", live1, "--mode", "live", "--json")), &br)
	t.Logf("live branch: paused %.1f ms, %d bytes, %.0f ms in all", br.PauseMillis, br.BytesWritten, br.TotalMillis)
	if br.Snapshot.State != apiv1.SnapshotReady || br.PauseMillis <= 0 {
		t.Fatalf("live branch: %+v", br)
	}
	c.ok("exec", src, "--", "sh", "-c", "echo after > /root/state")
	var kids apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", live1, "--json")), &kids)
	if out := c.ok("exec", kids.Sandboxes[0].ID, "--", "cat", "/root/state"); out != "before\n" {
		t.Fatalf("grandchild of a live branch sees %q", out)
	}
	c.ok("kill", kids.Sandboxes[0].ID)

	// --no-wait: writing, then ready.
	live2 := "it-live-b2-" + id
	json.Unmarshal([]byte(c.ok("branch", src, "--tag", live2, "--mode", "live", "--no-wait", "--json")), &br)
	if br.Snapshot.State != apiv1.SnapshotWriting {
		t.Fatalf("no-wait branch answered %+v", br.Snapshot)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var s apiv1.Snapshot
		json.Unmarshal([]byte(c.ok("snapshot", "info", live2, "--json")), &s)
		if s.State == apiv1.SnapshotReady {
			break
		}
		if s.State != apiv1.SnapshotWriting || time.Now().After(deadline) {
			t.Fatalf("no-wait branch: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// kill -9 of the daemon right after a no-wait live branch started.
	live3 := "it-live-b3-" + id
	c.ok("branch", src, "--tag", live3, "--mode", "live", "--no-wait")
	pid := c.daemonPID()
	syscall.Kill(pid, syscall.SIGKILL)
	waitGone(t, pid)
	c.ok("daemon", "start")
	if out := c.ok("exec", src, "--", "sh", "-c", "echo alive; cat /root/state"); out != "alive\nafter\n" {
		t.Fatalf("source after the daemon died mid-branch: %q", out)
	}
	out, errOut, code := c.run("snapshot", "info", live3, "--json")
	switch {
	case code != 0 && strings.Contains(errOut, "not found"):
		t.Logf("the interrupted branch left no tag")
	case code == 0:
		// It was committed before the kill: then it is whole.
		var s apiv1.Snapshot
		json.Unmarshal([]byte(out), &s)
		if s.State != apiv1.SnapshotReady && s.State != apiv1.SnapshotFailed {
			t.Fatalf("interrupted branch: %+v", s)
		}
		if s.State == apiv1.SnapshotReady {
			json.Unmarshal([]byte(c.ok("fork", "--tag", live3, "--json")), &kids)
			if out := c.ok("exec", kids.Sandboxes[0].ID, "--", "cat", "/root/state"); out != "after\n" {
				t.Fatalf("a branch committed before the kill forks with %q", out)
			}
			c.ok("kill", kids.Sandboxes[0].ID)
		}
		t.Logf("the interrupted branch is %s", s.State)
	default:
		t.Fatalf("snapshot info after the kill: exit %d %s %s", code, out, errOut)
	}
	// The source stays usable: another live branch works.
	c.ok("branch", src, "--tag", "it-live-b4-"+id, "--mode", "live")
	for _, t2 := range []string{live1, live2, live3, "it-live-b4-" + id} {
		c.run("rmi", t2)
	}
}
