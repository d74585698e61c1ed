package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestMigrationFiles follows the files QEMU migrates through (a template's
// and a branch's state file, a live branch's spool, a diff branch's device
// state) across a snapshot, forks, live and diff branches, forks of the
// branches, and a daemon restart that adopts the sandboxes. After each,
// no QEMU warned in its qemu.log of a deprecated migration (QEMU 9.1+ does
// for "fd:" to a file), and no QEMU still holds one of those files: a
// descriptor set the daemon failed to remove would keep it open (the
// daemon holds QMP, so query-fdsets itself is checked by the driver's
// TestMigrationFiles).
func TestMigrationFiles(t *testing.T) {
	memDir := "/dev/shm/forkd-it-" + snapshot.NewID()
	t.Cleanup(func() { os.RemoveAll(memDir) })
	c := newCLI(t)
	c.env = append(c.env, "FORKD_LIVE_BRANCH=1", "FORKD_MEMORY_DIR="+memDir)
	id := snapshot.NewID()
	tag := "it-mf-" + id
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	t.Cleanup(func() { c.run("rmi", "--cascade", tag) })
	fork := func(tag string) string {
		t.Helper()
		var fr apiv1.ForkResponse
		json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr)
		if len(fr.Sandboxes) != 1 {
			t.Fatalf("fork %s: %+v", tag, fr)
		}
		return fr.Sandboxes[0].ID
	}
	src := fork(tag)
	c.ok("exec", src, "--", "sh", "-c", "echo before > /root/state")
	c.checkMigrationFiles("fork")

	live := "it-mf-live-" + id
	c.ok("branch", src, "--tag", live, "--mode", "live")
	c.checkMigrationFiles("live branch")
	diff := "it-mf-diff-" + id
	c.ok("branch", src, "--tag", diff, "--mode", "diff")
	c.checkMigrationFiles("diff branch")
	for _, b := range []string{live, diff} {
		kid := fork(b)
		if out := c.ok("exec", kid, "--", "cat", "/root/state"); out != "before\n" {
			t.Fatalf("fork of %s sees %q", b, out)
		}
		c.checkMigrationFiles("fork of " + b)
	}

	// A new daemon adopts the sandboxes; its branches hand files over as
	// the QEMU they run (query-version) takes them.
	c.ok("daemon", "stop")
	c.ok("daemon", "start")
	c.ok("exec", src, "--", "sh", "-c", "echo adopted > /root/state")
	live2 := "it-mf-live2-" + id
	c.ok("branch", src, "--tag", live2, "--mode", "live")
	c.checkMigrationFiles("live branch after adoption")
	if out := c.ok("exec", fork(live2), "--", "cat", "/root/state"); out != "adopted\n" {
		t.Fatalf("fork of a branch after adoption sees %q", out)
	}
	c.checkMigrationFiles("fork after adoption")
	for _, b := range []string{live, diff, live2} {
		c.run("rmi", "--cascade", b)
	}
}

// checkMigrationFiles checks every VMM of the daemon after a hand-over
// (what): its qemu.log warns of no deprecation, and it holds no migration
// file open. QEMU closes its own descriptor a moment after the migration
// completes, and a pool child just prepared holds its state file until
// it is restored ahead (the default): both are waited for.
func (c *cli) checkMigrationFiles(what string) {
	c.t.Helper()
	vms, _ := filepath.Glob(filepath.Join(c.runDir, "vms", "*"))
	if len(vms) == 0 {
		c.t.Fatalf("after the %s: no VMM run directory in %s", what, filepath.Join(c.runDir, "vms"))
	}
	for _, dir := range vms {
		// Made on QEMU's first words: none, none printed. A VMM may also
		// have just ended.
		l := filepath.Join(dir, "qemu.log")
		data, err := os.ReadFile(l)
		if err != nil && !os.IsNotExist(err) {
			c.t.Fatal(err)
		}
		if strings.Contains(string(data), "deprecated") {
			c.t.Errorf("after the %s, %s:\n%s", what, l, data)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		held := c.heldMigrationFiles()
		if len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("after the %s, VMMs still hold migration files: %s", what, strings.Join(held, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldMigrationFiles lists the migration files the daemon's VMMs hold open.
func (c *cli) heldMigrationFiles() []string {
	var held []string
	for pid := range c.vmmPIDs() {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			if target, err := os.Readlink(fd); err == nil && isMigrationFile(target) {
				held = append(held, fmt.Sprintf("pid %d: %s", pid, target))
			}
		}
	}
	return held
}

// isMigrationFile says whether a descriptor's target is a file the driver
// hands to QEMU for a migration: a state file (in a snapshot, or staged),
// a live branch's spool, a branch's device state memfd.
func isMigrationFile(target string) bool {
	name := filepath.Base(strings.TrimSuffix(target, " (deleted)"))
	return name == snapshot.StateFile || strings.HasSuffix(name, ".live-stream") || strings.Contains(name, "forkd-devstate")
}
