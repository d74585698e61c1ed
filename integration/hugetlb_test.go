package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

const nrHugepages = "/proc/sys/vm/nr_hugepages"

// hugeMeminfo reads a HugePages_* counter of /proc/meminfo.
func hugeMeminfo(t *testing.T, key string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/meminfo", key)
	return 0
}

func setHugepages(t *testing.T, n int) {
	t.Helper()
	if err := os.WriteFile(nrHugepages, []byte(strconv.Itoa(n)), 0o644); err != nil {
		t.Fatalf("set %s: %v", nrHugepages, err)
	}
}

// hugetlbfsDir adds extra 2 MiB pages to the host's pool and mounts a
// hugetlbfs for the test; both are undone when it ends (after the
// daemons that cleanups registered later have stopped).
func hugetlbfsDir(t *testing.T, extra int) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: a huge page pool and a hugetlbfs mount")
	}
	data, err := os.ReadFile(nrHugepages)
	if err != nil {
		t.Skipf("no huge pages on this kernel: %v", err)
	}
	orig, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	free := hugeMeminfo(t, "HugePages_Free")
	setHugepages(t, orig+extra)
	t.Cleanup(func() { setHugepages(t, orig) })
	// The kernel gives what it can find in contiguous free memory: a
	// fragmented host has fewer pages to give, which is the host's state
	// rather than a fault of forkd.
	if got := hugeMeminfo(t, "HugePages_Free") - free; got < extra {
		t.Skipf("the kernel found %d free 2 MiB pages of the %d this test needs", got, extra)
	}
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "hugetlbfs", 0, "pagesize=2M"); err != nil {
		t.Fatalf("mount hugetlbfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// TestLiveBranchOnHugetlbfs runs a daemon whose memory dir is on
// hugetlbfs, where QEMU's write-protection for a live branch costs a
// page-table entry per 2 MiB instead of per 4 KiB: images are written
// through a mapping (hugetlbfs has no write(2)) with their stamps kept on
// the data dir, live and diff branches fork with the source's state, a
// diff layer holds only the 4 KiB pages that changed (not whole 2 MiB
// copies), and a pool too small for another sandbox is a clear error.
func TestLiveBranchOnHugetlbfs(t *testing.T) {
	// 256 MiB guests: 128 pages per memory image (one per forked tag: 4)
	// and per running or pooled VMM (each reserves its guest memory): the
	// source, two pooled per forked tag (8) and a grandchild, 10 at once
	// once every pool has refilled, as on a quiet host. 14 x 128 = 1,792
	// pages, and a margin.
	mnt := hugetlbfsDir(t, 2048)
	memDir := filepath.Join(mnt, "mem")
	c := newCLI(t)
	c.env = append(c.env, "FORKD_LIVE_BRANCH=1", "FORKD_MEMORY_DIR="+memDir)
	id := snapshot.NewID()
	tag := "it-huge-" + id
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	t.Cleanup(func() { c.run("rmi", "--cascade", tag) })
	fork := func(tag string) string {
		t.Helper()
		var fr apiv1.ForkResponse
		if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
			t.Fatalf("fork %s: %+v %v", tag, fr, err)
		}
		return fr.Sandboxes[0].ID
	}
	src := fork(tag)
	c.ok("exec", src, "--", "sh", "-c", "echo before > /root/state")

	var live apiv1.BranchResponse
	liveTag := "it-huge-live-" + id
	json.Unmarshal([]byte(c.ok("branch", src, "--tag", liveTag, "--mode", "live", "--json")), &live)
	t.Logf("live branch: paused %.2f ms, %d bytes", live.PauseMillis, live.BytesWritten)
	if live.Snapshot.State != apiv1.SnapshotReady || live.PauseMillis <= 0 {
		t.Fatalf("live branch: %+v", live)
	}
	c.ok("exec", src, "--", "sh", "-c", "echo after > /root/state")

	var diff apiv1.BranchResponse
	diffTag := "it-huge-diff-" + id
	json.Unmarshal([]byte(c.ok("branch", src, "--tag", diffTag, "--json")), &diff)
	t.Logf("diff branch: paused %.2f ms, %d bytes", diff.PauseMillis, diff.BytesWritten)
	// An idle minimal guest writes about 1 MiB between branches (tmpfs:
	// 1.3 MiB); whole 2 MiB copies would be near 30 MiB.
	if diff.Snapshot.State != apiv1.SnapshotReady || diff.BytesWritten > 12<<20 {
		t.Fatalf("diff branch: %+v", diff)
	}

	// A full branch copies the image from hugetlbfs before the pause and
	// the 2 MiB pages the clone wrote in it.
	var full apiv1.BranchResponse
	fullTag := "it-huge-full-" + id
	json.Unmarshal([]byte(c.ok("branch", src, "--tag", fullTag, "--mode", "full", "--json")), &full)
	t.Cleanup(func() { c.run("rmi", fullTag) })
	t.Logf("full branch: paused %.2f ms, %d bytes", full.PauseMillis, full.BytesWritten)
	if full.Snapshot.State != apiv1.SnapshotReady || full.Snapshot.DiskBytes <= 0 || full.Snapshot.DiskBytes > full.Snapshot.SizeBytes*3/4 {
		t.Fatalf("full branch: %+v", full)
	}

	for _, want := range []struct{ tag, state string }{{liveTag, "before"}, {diffTag, "after"}, {fullTag, "after"}} {
		g := fork(want.tag)
		if out := c.ok("exec", g, "--", "cat", "/root/state"); out != want.state+"\n" {
			t.Errorf("grandchild of %s sees %q, want %q", want.tag, out, want.state)
		}
		c.ok("kill", g)
	}

	// A compaction copies the image from hugetlbfs, which reports all of a
	// file as data: the copy stays sparse all the same.
	flatTag := "it-huge-flat-" + id
	c.ok("snapshot", "compact", "--from", diffTag, "--to", flatTag)
	t.Cleanup(func() { c.run("rmi", flatTag) })
	var flat apiv1.Snapshot
	json.Unmarshal([]byte(c.ok("snapshot", "info", flatTag, "--json")), &flat)
	t.Logf("compacted copy: %d bytes on disk of %d logical", flat.DiskBytes, flat.SizeBytes)
	if flat.DiskBytes <= 0 || flat.DiskBytes > flat.SizeBytes*3/4 {
		t.Errorf("compacted copy: %d bytes on disk of %d logical", flat.DiskBytes, flat.SizeBytes)
	}

	// The images clones map are on hugetlbfs, their stamps on the data dir.
	images, _ := os.ReadDir(memDir)
	if len(images) < 3 {
		t.Errorf("memory dir holds %d images, want one per forked tag (3)", len(images))
	}
	for _, im := range images {
		if _, err := os.Stat(filepath.Join(dataDir, "cache", "memory-stamps", im.Name()+".stamp")); err != nil {
			t.Errorf("image %s: %v", im.Name(), err)
		}
	}

	// No free pages left for another sandbox: the fork fails and says
	// which knob to turn.
	used := hugeMeminfo(t, "HugePages_Total") - hugeMeminfo(t, "HugePages_Free") + hugeMeminfo(t, "HugePages_Rsvd")
	setHugepages(t, used)
	_, errOut, code := c.run("fork", "--tag", diffTag, "-n", "3")
	if code == 0 || !strings.Contains(errOut, "nr_hugepages") {
		t.Errorf("fork with no free huge pages: exit %d, %s", code, errOut)
	}
}
