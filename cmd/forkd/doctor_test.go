package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/image"
	"golang.org/x/sys/unix"
)

func TestCgroupLayouts(t *testing.T) {
	const (
		unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
		hybrid  = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
			"32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n" +
			"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
			"39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n" +
			"40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n" +
			"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
		legacy = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
			"36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
		none = "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw\n"
	)
	for _, c := range []struct {
		name, mountinfo string
		v2              []string // the v2 root's cgroup.controllers
		ok              bool
		says            []string
	}{
		{"unified", unified, []string{"cpuset", "cpu", "io", "memory", "pids"}, true,
			[]string{"cgroup v2 (unified) at /sys/fs/cgroup", "memory (v2), cpu (v2), pids (v2)"}},
		{"unified without delegated controllers", unified, nil, true,
			[]string{"cgroup v2 (unified)", "forkd can use no controller", "missing: memory, cpu, pids"}},
		{"hybrid", hybrid, nil, true,
			[]string{"hybrid: cgroup v1 controllers, cgroup v2 at /sys/fs/cgroup/unified (controllers: none)",
				"memory (v1 at /sys/fs/cgroup/memory), cpu (v1 at /sys/fs/cgroup/cpu,cpuacct), pids (v1 at /sys/fs/cgroup/pids)"}},
		{"v1", legacy, nil, true, []string{"cgroup v1 (legacy)", "memory (v1 at /sys/fs/cgroup/memory)", "missing: cpu, pids"}},
		{"none", none, nil, false, []string{"no cgroup hierarchy mounted"}},
	} {
		l := parseCgroupMounts(c.mountinfo)
		l.v2 = c.v2
		ok, detail := l.describe()
		if ok != c.ok {
			t.Errorf("%s: ok %v, want %v (%s)", c.name, ok, c.ok, detail)
		}
		for _, s := range c.says {
			if !strings.Contains(detail, s) {
				t.Errorf("%s: %q does not say %q", c.name, detail, s)
			}
		}
	}
	// This host's layout is one of them.
	if c := cgroupCheck(); !c.OK || c.Detail == "" {
		t.Errorf("this host: %+v", c)
	}
}

// fakeCachedKernel lays out DATA/cache/kernel as the image builder leaves
// it after fetching a kernel.
func fakeCachedKernel(t *testing.T) string {
	t.Helper()
	data := t.TempDir()
	kdir := filepath.Join(data, "cache", "kernel")
	dir := filepath.Join(kdir, "6.1.99-1")
	os.MkdirAll(filepath.Join(dir, "modules"), 0o755)
	os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("kernel"), 0o444)
	os.WriteFile(filepath.Join(dir, "modules", "virtio.ko"), []byte("module"), 0o444)
	m, _ := json.Marshal(map[string]any{"format_version": 1, "version": "6.1.0-99-cloud-amd64", "package": "linux-image-6.1.0-99-cloud-amd64",
		"package_version": "6.1.99-1", "modules": []string{"virtio.ko"}})
	os.WriteFile(filepath.Join(dir, "kernel.json"), m, 0o644)
	os.WriteFile(filepath.Join(kdir, "current"), []byte("6.1.99-1\n"), 0o644)
	return data
}

func TestDoctorChecksBuilderToolsAndKernel(t *testing.T) {
	data := fakeCachedKernel(t)
	checks := hostChecks(context.Background(), &globals{dataDir: data})
	byName := map[string]apiv1.Check{}
	for _, c := range checks {
		byName[c.Name] = c
		if !c.OK && c.Fix == "" {
			t.Errorf("failed check %s has no fix", c.Name)
		}
	}
	for _, tool := range image.Tools() {
		c, ok := byName["tool "+tool.Name]
		if !ok {
			t.Errorf("doctor does not check %s, which the image builder runs", tool.Name)
		} else if !c.OK && !strings.Contains(c.Fix, tool.Package) {
			t.Errorf("fix for %s does not name its package %s: %q", tool.Name, tool.Package, c.Fix)
		}
	}
	k := byName["guest kernel"]
	if !k.OK || !strings.Contains(k.Detail, "6.1.0-99-cloud-amd64 cached") {
		t.Errorf("guest kernel with a cached kernel: %+v", k)
	}
	if _, ok := byName["cgroups"]; !ok {
		t.Error("no cgroups check")
	}
}

func TestDoctorJSONFailsWhenACheckFails(t *testing.T) {
	data := fakeCachedKernel(t)
	out, err := runCLI(t, nil, "--json", "--data-dir", data, "doctor", "--vmm", "no-such-vmm")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("doctor --json with a failing check: %v, want exit 1", err)
	}
	var checks []apiv1.Check
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("stdout is not the checks: %v\n%s", err, out)
	}
	found := false
	for _, c := range checks {
		if c.Name == "vmm driver" && !c.OK && strings.Contains(c.Fix, "qemu") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no failed vmm driver check with a fix in %+v", checks)
	}
}

// TestMemoryDirCheck: no check without a memory dir or live branches; a
// disk directory is fine until live branches need it, tmpfs always is.
func TestMemoryDirCheck(t *testing.T) {
	if _, ok := memoryDirCheck(&globals{}); ok {
		t.Error("a memory dir check without --memory-dir or --live-branch")
	}
	disk := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(disk, &st); err != nil || st.Type == unix.TMPFS_MAGIC {
		t.Skipf("the temp dir is on tmpfs here (%v)", err)
	}
	if c, _ := memoryDirCheck(&globals{memoryDir: disk}); !c.OK {
		t.Errorf("disk memory dir without live branches: %+v", c)
	}
	if c, _ := memoryDirCheck(&globals{memoryDir: disk, liveBranch: true}); c.OK || c.Fix == "" {
		t.Errorf("disk memory dir with live branches: %+v", c)
	}
	if _, err := os.Stat("/dev/shm"); err == nil {
		if c, _ := memoryDirCheck(&globals{liveBranch: true}); !c.OK || !strings.Contains(c.Detail, "tmpfs") {
			t.Errorf("default memory dir: %+v", c)
		}
	}
}
