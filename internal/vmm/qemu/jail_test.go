package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// TestJailedVMM checks, from the host, the jail of a running clone's QEMU
// (dropped to a uid of its own): its namespaces, what its root shows,
// its limits and capabilities; and that the guest works.
func TestJailedVMM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("jails need root")
	}
	f := template(t)
	d := newTestDriver(t, Config{UIDs: UIDRange{First: 2_000_200_000, Count: 2}})
	if !d.cfg.Jail {
		t.Fatal("test drivers jail their VMMs as root")
	}
	m, _ := f.clone(t, d, "jail1")
	other, _ := f.clone(t, d, "jail2")
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	conn, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := testguest.NewAgent(conn)
	defer a.Close()
	if _, err := m.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	call(t, a, "get", "state=template")

	pid := m.PID()
	proc := func(p string) string { return fmt.Sprintf("/proc/%d/%s", pid, p) }
	for _, ns := range []string{"mnt", "pid", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		its, err := os.Readlink(proc("ns/" + ns))
		if err != nil || its == mine {
			t.Errorf("%s namespace: %q (the test's %q) %v", ns, its, mine, err)
		}
	}
	status, err := os.ReadFile(proc("status"))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	// In its own PID namespace QEMU is process 1.
	if ns := strings.Fields(fields["NSpid"]); len(ns) != 2 || ns[1] != "1" {
		t.Errorf("NSpid %q, want the host's pid and 1", fields["NSpid"])
	}
	if fields["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs %q", fields["NoNewPrivs"])
	}
	// Dropped to its uid: no capabilities left; the bounding set keeps
	// only what it needed before dropping (dac_override 1, setgid 6,
	// setuid 7, net_admin 12).
	if fields["CapEff"] != "0000000000000000" || fields["CapPrm"] != "0000000000000000" {
		t.Errorf("capabilities: effective %s, permitted %s", fields["CapEff"], fields["CapPrm"])
	}
	if bnd, err := strconv.ParseUint(fields["CapBnd"], 16, 64); err != nil || bnd&^(1<<1|1<<6|1<<7|1<<12) != 0 {
		t.Errorf("bounding set %s", fields["CapBnd"])
	} else if d.feat.readonlyRAM && bnd&(1<<1) != 0 {
		t.Errorf("bounding set %s keeps dac_override, which a QEMU that opens the template read-only does not need", fields["CapBnd"])
	}
	limits, _ := os.ReadFile(proc("limits"))
	if !strings.Contains(string(limits), fmt.Sprintf("Max open files            %-21d%-21d", jailNoFile, jailNoFile)) {
		t.Errorf("limits:\n%s", limits)
	}
	// Its root: what it needs, nothing of other sandboxes or the host.
	root := proc("root")
	for _, p := range []string{"/usr/bin", m.cfg.RunDir, f.memFile, "/dev/net/tun", "/proc/1"} {
		if _, err := os.Stat(root + p); err != nil {
			t.Errorf("the jail lacks %s: %v", p, err)
		}
	}
	for _, p := range []string{other.cfg.RunDir, "/home", "/root", "/etc/shadow", "/etc/hostname", "/dev/shm", "/boot",
		fmt.Sprintf("/proc/%d", os.Getpid())} {
		if _, err := os.Stat(root + p); !os.IsNotExist(err) {
			t.Errorf("the jail shows %s: %v", p, err)
		}
	}
	// The host's /tmp is not its /tmp (which holds only the mount points
	// of test directories, made under /tmp).
	marker, err := os.CreateTemp("", "forkd-jail-marker-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	defer os.Remove(marker.Name())
	if _, err := os.Stat(root + marker.Name()); !os.IsNotExist(err) {
		t.Errorf("the jail shows the host's %s: %v", marker.Name(), err)
	}
	if err := os.WriteFile(filepath.Join(root, "newfile"), nil, 0o600); err == nil {
		t.Error("the jail's root is writable")
	}
	// Nothing of the jails is mounted on the host.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), jailRootDir) {
		t.Errorf("a jail's root is mounted on the host: %v", err)
	}
}

// TestVMMOOMKilled lowers a clone's cgroup memory limit below what its
// guest then writes: the host's OOM killer ends that QEMU alone, the exit
// says so, a sibling clone keeps running, and the group is removed.
func TestVMMOOMKilled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	f := template(t)
	d := newTestDriver(t, Config{})
	if d.cfg.Cgroups == nil {
		t.Fatal("test drivers put their VMMs in cgroups as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	restore := func(id string) (*Machine, *testguest.Agent) {
		m, _ := f.clone(t, d, id)
		conn, err := m.DialAgent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a := testguest.NewAgent(conn)
		t.Cleanup(func() { a.Close() })
		if _, err := m.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		call(t, a, "get", "state=template")
		return m, a
	}
	m, a := restore("oom1")
	sib, sa := restore("oom2")
	if m.cg == nil {
		t.Fatal("no cgroup")
	}
	dirs := m.cg.Dirs()
	lim, err := m.cg.Limits()
	if err != nil || lim.MemoryBytes != int64(testMemMiB+d.cfg.TBSizeMiB+vmmOverheadMiB)<<20 || lim.Pids != vmmPids {
		t.Fatalf("limits %+v %v", lim, err)
	}
	// Its current charge plus 16 MiB: the guest's 64 MiB write passes it.
	st, err := m.cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	low := strconv.FormatUint(st.MemoryCurrent+16<<20, 10)
	for _, dir := range dirs {
		for _, file := range []string{"memory.limit_in_bytes", "memory.max"} {
			if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, file), []byte(low), 0); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	t.Logf("charged %d MiB; limit lowered to %s bytes", st.MemoryCurrent>>20, low)
	a.Call("run dd if=/dev/zero of=/tmp/fill bs=1M count=64", callTimeout) // its reply may never come
	select {
	case <-m.Done():
	case <-ctx.Done():
		t.Fatal("the clone outlived its memory limit")
	}
	err = m.ExitError()
	if err == nil || !strings.Contains(err.Error(), "OOM killer") {
		t.Errorf("exit: %v, want the OOM killer named", err)
	}
	t.Logf("exit: %v", err)
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left: %v", dir, err)
		}
	}
	call(t, sa, "get", "state=template")
	checkRunning(t, sib, sa, "template")

	// A fork's CPU limit, set while the VMM runs.
	if err := sib.SetCPULimit(500); err != nil {
		t.Fatal(err)
	}
	if l, err := sib.cg.Limits(); err != nil || l.CPUMillicores != 500 {
		t.Errorf("after SetCPULimit(500): %+v %v", l, err)
	}
	if err := sib.SetCPULimit(1); !errdefs.IsInvalidArgument(err) {
		t.Errorf("SetCPULimit(1): %v, want invalid argument", err)
	}
	checkRunning(t, sib, sa, "template")
}

// TestLiveBranchOwnUserfaultfd branches live a clone whose QEMU runs as a
// uid of its own: the userfaultfd comes from a /dev/userfaultfd node of
// that uid inside its jail (QEMU opens it: inotify sees the open), not
// from vm.unprivileged_userfaultfd; the host's node stays root's.
func TestLiveBranchOwnUserfaultfd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("jails need root")
	}
	if _, err := os.Stat(uffdDevice); err != nil {
		t.Skip("no /dev/userfaultfd (Linux 6.1+):", err)
	}
	sf := buildShmTemplate(t)
	d := newTestDriver(t, Config{UIDs: UIDRange{First: 2_000_200_100, Count: 2}})
	if !d.feat.uffdDevice {
		t.Skipf("QEMU %s does not open /dev/userfaultfd (8.1+)", d.version)
	}
	if d.NeedsUnprivilegedUserfaultfd() {
		t.Error("a jailed driver with uids of its own says it needs vm.unprivileged_userfaultfd")
	}
	c, ca := sf.src.restore(t, d, "uffd")
	node := fmt.Sprintf("/proc/%d/root%s", c.PID(), uffdDevice)
	var st unix.Stat_t
	if err := unix.Stat(node, &st); err != nil {
		t.Fatalf("the jail has no %s: %v", uffdDevice, err)
	}
	if int(st.Uid) != c.uid || st.Uid == 0 || st.Mode&0o777 != 0o600 || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatalf("the jail's %s: uid %d (QEMU's %d), mode %o", uffdDevice, st.Uid, c.uid, st.Mode)
	}
	if err := unix.Stat(uffdDevice, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o600 {
		t.Errorf("the host's %s: uid %d mode %o %v", uffdDevice, st.Uid, st.Mode&0o777, err)
	}
	if err := c.LiveBranchSupport(); err != nil {
		t.Fatal(err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, node, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	call(t, ca, "set own-uffd", "ok")
	out, err := os.MkdirTemp("/dev/shm", "forkd-branch-out-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	res, err := c.Snapshot(ctx, branchSpec(out, "u1", vmm.SnapshotLive))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := unix.Read(in, buf); err != nil || n < unix.SizeofInotifyEvent {
		t.Errorf("QEMU did not open its %s during the live branch: %d bytes, %v", uffdDevice, n, err)
	}
	t.Logf("live branch as uid %d: paused %v, %d pages", c.uid, res.Paused, res.DirtyPages)
	checkRunning(t, c, ca, "own-uffd")
}

// TestTemplateMemoryReadOnly takes, from outside, the descriptor a clone's
// QEMU holds of the template's memory file (pidfd_getfd, as a compromised
// VMM would hold it) and writes through it: the write fails, and the
// template is unchanged. In its jail the file is bound read-only too.
func TestTemplateMemoryReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("jails and pidfd_getfd need root")
	}
	f := template(t)
	d := newTestDriver(t, Config{UIDs: UIDRange{First: 2_000_200_200, Count: 1}})
	if !d.feat.readonlyRAM {
		t.Skipf("QEMU %s opens guest RAM files read-write (readonly=on,rom=off needs 8.2): docs/SECURITY.md, Template memory", d.version)
	}
	m, _ := f.clone(t, d, "romem")
	pid := m.PID()
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(fdDir, e.Name())); err == nil && target == f.memFile {
			n, _ := strconv.Atoi(e.Name())
			fds = append(fds, n)
		}
	}
	if len(fds) == 0 {
		t.Fatalf("QEMU %d holds no descriptor of %s", pid, f.memFile)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	for _, n := range fds {
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			t.Fatalf("pidfd_getfd %d: %v", n, err)
		}
		if _, err := unix.Pwrite(fd, []byte("forkd"), 4096); err != unix.EBADF {
			t.Errorf("a write through QEMU's descriptor %d of the template: %v, want EBADF", n, err)
		}
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != unix.EBADF {
			t.Errorf("punching a hole through QEMU's descriptor %d: %v, want EBADF", n, err)
		}
		unix.Close(fd)
	}
	if _, err := os.OpenFile(fmt.Sprintf("/proc/%d/root%s", pid, f.memFile), os.O_WRONLY, 0); !errors.Is(err, unix.EROFS) {
		t.Errorf("the template opened for writing inside the jail: %v, want EROFS", err)
	}
	checkTemplateUnchanged(t, f.memFile, f.memHash)
}

// TestDiskReadLimit: a machine's DiskRead becomes QEMU's throttling of its
// root disk, as QEMU reports it (query-block).
func TestDiskReadLimit(t *testing.T) {
	f := template(t)
	d := newTestDriver(t, Config{UIDs: UIDRange{First: 2_000_200_300, Count: 1}})
	dir := shortDir(t, "forkd-disk")
	t.Cleanup(func() { os.RemoveAll(dir) })
	rootfs := filepath.Join(dir, "root.img")
	if err := os.WriteFile(rootfs, make([]byte, 1<<20), 0o444); err != nil {
		t.Fatal(err)
	}
	img := f.image
	img.Rootfs = rootfs
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	m, err := d.Boot(ctx, vmm.BootSpec{MachineConfig: vmm.MachineConfig{
		ID: "disk", RunDir: filepath.Join(dir, "run"), Image: img, MemoryMiB: testMemMiB,
		DiskRead: vmm.RateLimit{BytesPerSec: 4 << 20, OpsPerSec: 300},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(); <-m.Done() })
	var blocks []struct {
		Device   string `json:"device"`
		Inserted *struct {
			File   string `json:"file"`
			BpsRd  int64  `json:"bps_rd"`
			IopsRd int64  `json:"iops_rd"`
			BpsWr  int64  `json:"bps_wr"`
			RO     bool   `json:"ro"`
		} `json:"inserted"`
	}
	if err := m.(*Machine).QMP().Execute(ctx, "query-block", nil, &blocks); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range blocks {
		if b.Inserted == nil || b.Inserted.File != rootfs {
			continue
		}
		found = true
		if b.Inserted.BpsRd != 4<<20 || b.Inserted.IopsRd != 300 || b.Inserted.BpsWr != 0 || !b.Inserted.RO {
			t.Errorf("root disk %+v: want 4 MiB/s and 300 reads/s, read-only", *b.Inserted)
		}
	}
	if !found {
		t.Fatalf("no block device with %s in %+v", rootfs, blocks)
	}
}
