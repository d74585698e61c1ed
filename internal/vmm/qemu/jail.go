package qemu

// Each QEMU in a jail of its own (internal/jail): it sees its binary and
// libraries, its own kernel, initramfs, root file system, memory file and
// run directory, and the few devices it opens; nothing of other
// sandboxes, the host's /tmp, /dev/shm, /home or /etc.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/jail"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// jailNoFile is the descriptor limit of a jailed QEMU: it holds a few
// dozen (sockets, eventfds per vCPU and device, the memory file); the
// daemon's own limit (often 1048576) is no business of a VMM's.
const jailNoFile = 4096

// jailRootDir is the empty directory, next to the run directories, that
// every jail mounts its private root on (in its own mount namespace).
const jailRootDir = ".jail"

// etcFiles are the few files of /etc a QEMU reads: the loader's cache,
// and the user database for -runas by name.
var etcFiles = []string{"/etc/ld.so.cache", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf"}

// jailSpec is what l's QEMU, binary at bin, may see and do.
func jailSpec(l *launch, bin string) jail.Spec {
	c := l.cfg
	s := jail.Spec{
		Root: filepath.Join(filepath.Dir(c.RunDir), jailRootDir),
		Binds: []jail.Bind{
			{Path: "/usr", Exec: true},
			{Path: c.RunDir, Writable: true},
			{Path: c.Image.Kernel},
		},
		Devices: []string{"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"},
		RLimits: []jail.RLimit{
			{Resource: unix.RLIMIT_NOFILE, Cur: jailNoFile, Max: jailNoFile},
			// A core of a VMM is a copy of a guest's memory.
			{Resource: unix.RLIMIT_CORE},
		},
		// What QEMU does as root before -runas: open its files (a
		// snapshot's memory file is read-only, 0400, and QEMU 7.2 opens
		// it read-write: see "Template memory" in docs/SECURITY.md), the
		// tap (TUNSETIFF), and drop to its uid and gid.
		KeepCaps: []int{unix.CAP_DAC_OVERRIDE, unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_NET_ADMIN},
		Hostname: "forkd-vmm",
		TmpBytes: 1 << 20,
	}
	if l.feat.readonlyRAM {
		// QEMU opens the template's memory file (0400) read-only: root's
		// own files need no override.
		s.KeepCaps = slices.DeleteFunc(s.KeepCaps, func(c int) bool { return c == unix.CAP_DAC_OVERRIDE })
	}
	if !strings.HasPrefix(bin, "/usr/") {
		s.Binds = append(s.Binds, jail.Bind{Path: filepath.Dir(bin), Exec: true})
	}
	for _, f := range etcFiles {
		if _, err := os.Stat(f); err == nil {
			s.Binds = append(s.Binds, jail.Bind{Path: f})
		}
	}
	if c.Image.Initrd != "" && !l.incoming {
		s.Binds = append(s.Binds, jail.Bind{Path: c.Image.Initrd})
	}
	if c.Image.Rootfs != "" {
		s.Binds = append(s.Binds, jail.Bind{Path: c.Image.Rootfs})
	}
	if c.MemoryFile != "" {
		// A template writes its memory file. A clone's QEMU opens it
		// read-only where it can (features.readonlyRAM); QEMU 7.2 opens
		// it read-write even for a private mapping (docs/SECURITY.md,
		// "Template memory").
		s.Binds = append(s.Binds, jail.Bind{Path: c.MemoryFile, Writable: l.memShared() || !l.feat.readonlyRAM})
	}
	if c.Network != nil {
		s.Devices = append(s.Devices, "/dev/net/tun")
	}
	if l.accel == vmm.AccelKVM {
		s.Devices = append(s.Devices, "/dev/kvm")
	}
	if l.runAs == "" {
		// QEMU stays root: a live branch's userfaultfd needs
		// CAP_SYS_PTRACE unless vm.unprivileged_userfaultfd is 1.
		s.KeepCaps = append(s.KeepCaps, unix.CAP_SYS_PTRACE)
	}
	if l.feat.uffdDevice && l.uid != 0 && l.incoming && onShmem(c.MemoryFile) && exists(uffdDevice) {
		// A clone that can be branched live gets a userfaultfd from a
		// /dev/userfaultfd node of its own uid (QEMU 8.1+ tries the
		// device first): the host needs no vm.unprivileged_userfaultfd,
		// and no other process gains anything.
		s.OwnedDevices = append(s.OwnedDevices, jail.OwnedDevice{Path: uffdDevice, UID: l.uid, GID: l.uid})
	}
	return s
}

// uffdDevice is the kernel's userfaultfd device (Linux 6.1+).
const uffdDevice = "/dev/userfaultfd"

// onShmem reports whether path is on tmpfs or hugetlbfs, where a live
// branch's write-protection works (see liveSupport).
func onShmem(path string) bool {
	var sfs unix.Statfs_t
	return path != "" && unix.Statfs(path, &sfs) == nil && shmemFS(&sfs)
}

// shmemFS reports whether a file system is tmpfs or hugetlbfs.
func shmemFS(sfs *unix.Statfs_t) bool {
	return sfs.Type == unix.TMPFS_MAGIC || sfs.Type == unix.HUGETLBFS_MAGIC
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
