package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// fakeV2 is a directory tree that imitates a cgroup2 mount: mkdir
// populates the control files of the controllers the parent enables, as
// the kernel does, and rmdir drops them. Writes land in plain files, so
// this checks what forkd writes, not what a kernel does with it: cgroup
// v2 OOM behaviour is NOT verified by it.
type fakeV2 struct{ root string }

func newFakeV2(t *testing.T, controllers string) (*fakeV2, fsOps) {
	f := &fakeV2{root: t.TempDir()}
	for name, v := range map[string]string{
		"cgroup.controllers": controllers, "cgroup.subtree_control": "", "cgroup.procs": "1\n",
	} {
		if err := os.WriteFile(filepath.Join(f.root, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f, fsOps{mkdir: f.mkdir, rmdir: f.rmdir}
}

func (f *fakeV2) mkdir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	parent, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"))
	var enabled []string
	for _, c := range strings.Fields(string(parent)) {
		enabled = append(enabled, strings.TrimPrefix(c, "+"))
	}
	files := map[string]string{
		"cgroup.controllers": strings.Join(enabled, " "), "cgroup.subtree_control": "", "cgroup.procs": "",
		"cgroup.kill": "", "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
	}
	perController := map[string]map[string]string{
		"memory": {"memory.current": "0", "memory.peak": "0", "memory.max": "max", "memory.swap.max": "max",
			"memory.oom.group": "0", "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"},
		"cpu":  {"cpu.max": "max 100000", "cpu.weight": "100"},
		"pids": {"pids.max": "max", "pids.current": "0", "pids.events": "max 0\n"},
		"io":   {"io.weight": "default 100\n"},
	}
	for _, c := range enabled {
		for k, v := range perController[c] {
			files[k] = v
		}
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rmdir fails as the kernel's does on a group with children or
// processes, and otherwise drops the control files with the directory.
func (f *fakeV2) rmdir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			return &os.PathError{Op: "rmdir", Path: dir, Err: unix.EBUSY}
		}
	}
	if p, _ := readPids(dir); len(p) > 0 {
		return &os.PathError{Op: "rmdir", Path: dir, Err: unix.EBUSY}
	}
	return os.RemoveAll(dir)
}

// TestV2Contract runs the conformance suite's file-writing parts against
// a v2 Manager on a fake cgroupfs (this host's controllers are held by
// v1). Kernel behaviour under v2 (OOM kill, pids and CPU enforcement,
// clone3 placement with controllers) is not verified here.
func TestV2Contract(t *testing.T) {
	runConformance(t, suite{
		newManager: func(t *testing.T) *Manager {
			f, ops := newFakeV2(t, "cpuset cpu io memory hugetlb pids rdma misc")
			h := &Hierarchy{Mode: ModeV2, Unified: f.root, UnifiedSelf: "/system.slice/forkd.service"}
			m, err := newManager(Config{Hierarchy: h}, ops)
			if err != nil {
				t.Fatal(err)
			}
			cleanupManager(t, m)
			return m
		},
		oomKill: func(t *testing.T, g *Group) {
			ev := "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 1\n"
			if err := os.WriteFile(filepath.Join(g.Dirs()[0], "memory.events"), []byte(ev), 0o644); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestV2ContractSetup checks the parent's setup on v2: controllers
// enabled down the path, what is missing named.
func TestV2ContractSetup(t *testing.T) {
	f, ops := newFakeV2(t, "cpu memory pids")
	h := &Hierarchy{Mode: ModeV2, Unified: f.root, UnifiedSelf: "/a.slice/forkd.service"}
	m, err := newManager(Config{Hierarchy: h, Parent: "../sandboxes"}, ops)
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(f.root, "a.slice/sandboxes")
	if got := m.b.parents(); !slices.Equal(got, []string{parent}) {
		t.Errorf("parent %v, want %s", got, parent)
	}
	for _, d := range []string{f.root, filepath.Join(f.root, "a.slice"), parent} {
		for _, c := range []Controller{Memory, CPU, Pids} {
			if !(&v2{}).enabled(d, c) {
				t.Errorf("%s not enabled in %s/cgroup.subtree_control", c, d)
			}
		}
	}
	io := controllerInfo(m, IO)
	if io.Available || !strings.Contains(io.Detail, "not in "+f.root+"/cgroup.controllers") {
		t.Errorf("io: %+v, want unavailable, naming the root's cgroup.controllers", io)
	}
	if mem := controllerInfo(m, Memory); !mem.Available || !strings.Contains(mem.Detail, "memory.swap.max=0") {
		t.Errorf("memory: %+v", mem)
	}
	// A required controller that is missing fails New, naming it.
	f2, ops2 := newFakeV2(t, "cpu memory")
	_, err = newManager(Config{Hierarchy: &Hierarchy{Mode: ModeV2, Unified: f2.root, UnifiedSelf: "/"}}, ops2)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pids (not in "+f2.root) {
		t.Errorf("New without pids: %v, want failed precondition naming pids", err)
	}
	if _, err := newManager(Config{Hierarchy: &Hierarchy{Mode: ModeV2, Unified: f2.root, UnifiedSelf: "/"}, Parent: "/"}, ops2); !errdefs.IsInvalidArgument(err) {
		t.Errorf("parent at the root: %v, want invalid argument", err)
	}
}

func TestValidate(t *testing.T) {
	if err := (Limits{}).Validate(); err != nil {
		t.Errorf("zero limits: %v", err)
	}
	ok := Limits{MemoryBytes: MinMemoryBytes, CPUMillicores: MaxCPUMillicores, CPUWeight: 1, Pids: MinPids, IOWeight: MaxWeight}
	if err := ok.Validate(); err != nil {
		t.Errorf("limits at the bounds: %v", err)
	}
	for _, tc := range []struct {
		l    Limits
		want string
	}{
		{Limits{MemoryBytes: -1}, "MemoryBytes=-1 is out of range [1048576, 1125899906842624] (0: no limit)"},
		{Limits{CPUMillicores: 5}, "CPUMillicores=5 is out of range [10, 1000000] (0: no quota)"},
		{Limits{CPUWeight: 10001}, "CPUWeight=10001 is out of range [1, 10000] (0: default weight)"},
		{Limits{Pids: 7}, "Pids=7 is out of range [8, 4194304]"},
		{Limits{IOWeight: -5}, "IOWeight=-5 is out of range [1, 10000]"},
	} {
		err := tc.l.Validate()
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want invalid argument with %q", tc.l, err, tc.want)
		}
	}
}

func TestWeights(t *testing.T) {
	for w, shares := range map[int64]int64{1: 10, 100: 1024, 250: 2560, 10000: 102400} {
		if got := cpuShares(w); got != shares {
			t.Errorf("cpuShares(%d) = %d, want %d", w, got, shares)
		}
		if got := cpuWeightFromShares(shares); got != w {
			t.Errorf("cpuWeightFromShares(%d) = %d, want %d", shares, got, w)
		}
	}
	for w, b := range map[int64]int64{1: 1, 100: 100, 10000: 1000, 1090: 190} {
		if got := bfqWeight(w); got != b {
			t.Errorf("bfqWeight(%d) = %d, want %d", w, got, b)
		}
		if got := ioWeightFromBFQ(b); got != w {
			t.Errorf("ioWeightFromBFQ(%d) = %d, want %d", b, got, w)
		}
	}
	if blkioWeight(100) != 500 || blkioWeight(1) != 10 || blkioWeight(10000) != 1000 {
		t.Error("blkioWeight")
	}
}

func TestParseHierarchy(t *testing.T) {
	// This host: v1 controllers plus systemd's empty cgroup2 mount.
	hybrid := `31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 30 0:34 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	self := "9:name=systemd:/\n8:pids:/\n7:blkio:/\n4:memory:/process_api/9daa\n2:cpuacct:/\n1:cpu:/\n0::/\n"
	h, err := parseHierarchy([]byte(hybrid), []byte(self))
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode != ModeHybrid || h.Unified != "/sys/fs/cgroup/unified" || h.UnifiedSelf != "/" {
		t.Errorf("hybrid: %+v", h)
	}
	if m := h.V1["memory"]; m.Mountpoint != "/sys/fs/cgroup/memory" || m.Self != "/process_api/9daa" {
		t.Errorf("memory: %+v", m)
	}
	if _, ok := h.V1["name=systemd"]; ok || len(h.V1) != 5 {
		t.Errorf("v1 hierarchies: %+v", h.V1)
	}

	// Co-mounted cpu,cpuacct inside a container whose mounts are
	// sub-trees of the host's hierarchies.
	v1 := `25 24 0:22 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
`
	h, err = parseHierarchy([]byte(v1), []byte("3:cpu,cpuacct:/docker/abc\n2:memory:/docker/abc/sub\n"))
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode != ModeV1 || h.V1["cpu"] != h.V1["cpuacct"] || h.V1["cpu"].Self != "/" || h.V1["memory"].Self != "/sub" {
		t.Errorf("v1 container: %+v", h)
	}

	v2 := "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	h, err = parseHierarchy([]byte(v2), []byte("0::/system.slice/forkd.service\n"))
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode != ModeV2 || h.Unified != "/sys/fs/cgroup" || h.UnifiedSelf != "/system.slice/forkd.service" {
		t.Errorf("v2: %+v", h)
	}
	if _, err := parseHierarchy(nil, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("nothing mounted: %v", err)
	}
	if got := unescape(`/a\040b`); got != "/a b" {
		t.Errorf("unescape = %q", got)
	}
}
