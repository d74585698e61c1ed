package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestHostileGuests runs attacks as root inside real guests, through the
// daemon as a user would: a fork bomb, a guest that fills its memory and
// its disk, and one that floods its serial console. After each: the
// daemon answers, its memory stayed within a bound, the sibling sandbox
// works, the VMM stayed within its cgroup and the console log within its
// cap, and the attacker can still be killed.
func TestHostileGuests(t *testing.T) {
	c := newCLI(t)
	tag := "it-hostile-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "-n", "3", "--json")), &fr); err != nil {
		t.Fatal(err)
	}
	bomber, filler, sibling := fr.Sandboxes[0].ID, fr.Sandboxes[1].ID, fr.Sandboxes[2].ID
	daemon := c.daemonPID()
	rss0 := vmRSS(t, daemon)
	healthy := func(after string) {
		t.Helper()
		if out := c.ok("exec", sibling, "--", "echo", "sibling ok"); out != "sibling ok\n" {
			t.Fatalf("after %s: sibling answered %q", after, out)
		}
		c.ok("ls")
		if rss := vmRSS(t, daemon); rss > rss0+96<<20 {
			t.Errorf("after %s: daemon RSS %d MiB, %d MiB before the attacks", after, rss>>20, rss0>>20)
		}
	}

	// A fork bomb: the guest's own kernel bears it; its process group is
	// killed after the timeout.
	out, errOut, code := c.run("exec", bomber, "--timeout", "15s", "--", "sh", "-c", "b(){ b|b& }; b; sleep 30")
	t.Logf("fork bomb: exit %d %q %q", code, tail(out, 200), tail(errOut, 300))
	healthy("the fork bomb")
	// The bomber's guest survives it or dies alone (its kernel may panic
	// out of memory), reported with the reason.
	switch info := sandboxInfo(t, c, bomber); {
	case info.State == apiv1.StateRunning:
	case info.State == apiv1.StateDead && info.DeadReason != "":
		t.Logf("the bomber died: %s", tail(info.DeadReason, 300))
	default:
		t.Errorf("the bomber is %s (%q)", info.State, info.DeadReason)
	}

	// Memory and disk: the guest writes far more than its 256 MiB into its
	// RAM-backed root and /tmp, then into a file on its disk layer.
	out, errOut, code = c.run("exec", filler, "--timeout", "60s", "--", "sh", "-c",
		"head -c 1000000000 /dev/zero > /tmp/fill; echo tmp $?; dd if=/dev/zero of=/fill bs=1M count=1000 2>&1 | tail -1; echo done")
	t.Logf("fill: exit %d %q %q", code, tail(out, 300), tail(errOut, 300))
	healthy("the memory and disk fill")
	if peak, limit, ok := vmmMemory(t, filler); ok {
		t.Logf("filler's VMM: peak %d MiB, cgroup limit %d MiB", peak>>20, limit>>20)
		if peak > limit {
			t.Errorf("the filler's VMM peaked at %d MiB, past its limit of %d MiB", peak>>20, limit>>20)
		}
	}

	// The serial console flooded with 20 MB: the log on the host stays
	// within its cap (two generations of 512 KiB).
	if info := sandboxInfo(t, c, filler); info.State == apiv1.StateRunning {
		out, errOut, code = c.run("exec", filler, "--timeout", "120s", "--", "sh", "-c",
			"head -c 20000000 /dev/zero | tr '\\0' x > /dev/console; echo flooded")
		t.Logf("serial flood: exit %d %q %q", code, tail(out, 200), tail(errOut, 300))
		var total int64
		logs, _ := filepath.Glob(filepath.Join(c.runDir, "vms", filler, "console.log*"))
		for _, l := range logs {
			if st, err := os.Stat(l); err == nil {
				total += st.Size()
			}
		}
		if len(logs) == 0 || total > 1<<20+64<<10 {
			t.Errorf("console logs %v: %d bytes on the host", logs, total)
		}
		healthy("the serial flood")
	} else {
		t.Logf("the filler is %s after filling its memory (%s): serial flood skipped", info.State, info.DeadReason)
	}

	// Every attacker can be ended.
	c.ok("kill", bomber, filler)
	healthy("killing the attackers")

	// A fork may ask for less CPU: its VMM's cgroup holds it.
	var half apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--cpus", "0.5", "--json")), &half); err != nil {
		t.Fatal(err)
	}
	id := half.Sandboxes[0].ID
	if info := sandboxInfo(t, c, id); info.CPUs != 0.5 {
		t.Errorf("sandbox info cpus %v, want 0.5", info.CPUs)
	}
	quota := ""
	for _, d := range append(globDirs("/sys/fs/cgroup/cpu/**/"+id), globDirs("/sys/fs/cgroup/**/"+id)...) {
		for _, f := range []string{"cpu.cfs_quota_us", "cpu.max"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil && quota == "" {
				quota = strings.TrimSpace(string(b))
			}
		}
	}
	if quota != "50000" && quota != "50000 100000" {
		t.Errorf("the --cpus 0.5 sandbox's cgroup CPU quota is %q, want 50000 µs per 100 ms", quota)
	}
	if out, _, code := c.run("fork", "--tag", tag, "--cpus", "3"); code == 0 {
		t.Errorf("--cpus 3 on a 1-vCPU snapshot succeeded: %s", out)
	}
	c.ok("kill", id)
}

// vmRSS is a process's resident memory in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// vmmMemory finds a sandbox's VMM cgroup in the memory hierarchy (v1 or
// v2) and reads its peak use and limit.
func vmmMemory(t *testing.T, id string) (peak, limit int64, ok bool) {
	t.Helper()
	for _, pat := range []string{"/sys/fs/cgroup/memory/**/" + id, "/sys/fs/cgroup/**/" + id} {
		dirs := globDirs(pat)
		for _, d := range dirs {
			read := func(f string) (int64, bool) {
				b, err := os.ReadFile(filepath.Join(d, f))
				if err != nil {
					return 0, false
				}
				v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return v, err == nil
			}
			if p, ok1 := read("memory.max_usage_in_bytes"); ok1 {
				l, _ := read("memory.limit_in_bytes")
				return p, l, true
			}
			if p, ok1 := read("memory.peak"); ok1 {
				l, _ := read("memory.max")
				return p, l, true
			}
		}
	}
	t.Errorf("no memory cgroup found for %s", id)
	return 0, 0, false
}

// globDirs finds directories matching a pattern whose one "**" stands for
// any depth of directories.
func globDirs(pattern string) []string {
	root, name, _ := strings.Cut(pattern, "/**/")
	var found []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == name {
			found = append(found, p)
			return filepath.SkipDir
		}
		return nil
	})
	return found
}

// sandboxInfo is `forkd sandbox info ID --json`.
func sandboxInfo(t *testing.T, c *cli, id string) apiv1.Sandbox {
	t.Helper()
	var s apiv1.Sandbox
	if err := json.Unmarshal([]byte(c.ok("sandbox", "info", id, "--json")), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDiskReadLimited: a daemon run with --disk-read-mbps (here through
// its environment variable) caps what a guest reads from its root disk:
// 8 MiB read with O_DIRECT at 2 MiB/s cannot take less than about 3.5 s
// (QEMU's bucket allows a tenth of a second's burst). Only a lower bound
// on time is asserted: a loaded machine only makes it slower.
func TestDiskReadLimited(t *testing.T) {
	c := newCLI(t)
	c.env = append(c.env, "FORKD_DISK_READ_MBPS=2")
	tag := "it-diskread-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr); err != nil {
		t.Fatal(err)
	}
	id := fr.Sandboxes[0].ID
	defer c.run("kill", id)
	start := time.Now()
	out := c.ok("exec", id, "--", "dd", "if=/dev/vda", "of=/dev/null", "bs=1M", "count=8", "iflag=direct")
	took := time.Since(start)
	t.Logf("8 MiB read at 2 MiB/s in %v: %q", took, tail(out, 200))
	if took < 2500*time.Millisecond {
		t.Errorf("8 MiB read in %v: the 2 MiB/s limit did not hold", took)
	}
	if out := c.ok("exec", id, "--", "echo", "still here"); out != "still here\n" {
		t.Errorf("after the read: %q", out)
	}
}
