package qemu

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// TCGWarning is what doctor and the daemon's start-up log say when guests
// run under TCG: QEMU's security policy counts only guests under a
// hardware accelerator (KVM) as isolated, so TCG must not run untrusted
// code (docs/SECURITY.md).
const TCGWarning = "TCG software emulation will be used: slow, and not a security boundary (QEMU supports only KVM guests as isolated); use KVM for untrusted code"

// Checks probes the host for what this driver needs, for `forkd doctor`.
// Every failed check carries a Fix. A host without KVM passes with a note:
// TCG works, slower, and is no security boundary (TCGWarning).
func Checks(ctx context.Context, opts vmm.Options) []vmm.Check {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var checks []vmm.Check
	binary := opts.Binary
	if binary == "" {
		binary = DefaultBinary
	}

	path, err := exec.LookPath(binary)
	checks = append(checks, vmm.Check{
		Name:   "qemu binary",
		OK:     err == nil,
		Detail: orErr(path, err),
		Fix:    "apt-get install qemu-system-x86 (or set the VMM binary option to its path)",
	})
	if err == nil {
		v, err := binaryVersion(ctx, path)
		detail := orErr(v, err)
		if err == nil && !featuresOf(v).readonlyRAM {
			detail += "; older than 8.2: a clone's VMM holds the template's memory read-write, and live branches need vm.unprivileged_userfaultfd=1 (scripts/install-deps.sh installs 10.0 from bookworm-backports)"
		}
		checks = append(checks, vmm.Check{
			Name:   "qemu version",
			OK:     err == nil && majorVersion(v) >= 7,
			Detail: detail,
			Fix:    "install QEMU 8.2 or newer (Debian 13's qemu-system-x86, or bookworm-backports on Debian 12); 7.2 is the oldest that runs",
		})
	}

	kvm, why := kvmUsable()
	c := vmm.Check{
		Name:   "kvm",
		OK:     kvm || opts.Accel != vmm.AccelKVM,
		Detail: why,
		Fix:    "enable hardware virtualization (VT-x/AMD-V, or nested virtualization for a VM) and give forkd read-write access to /dev/kvm",
	}
	if !kvm {
		c.Detail += "; " + TCGWarning
	}
	checks = append(checks, c)

	checks = append(checks, tunCheck())
	checks = append(checks, userfaultfdCheck())
	checks = append(checks, jailCheck(opts.NoJail))
	return checks
}

// jailCheck reports whether VMMs start in their jails (jail.go): root and
// the kernel's mount, PID, IPC and UTS namespaces; or that the operator
// turned the jail off.
func jailCheck(off bool) vmm.Check {
	c := vmm.Check{Name: "vmm jail", Fix: "run forkd as root on a kernel with mount, PID, IPC and UTS namespaces, and without --no-vmm-jail"}
	if off {
		c.Detail = "off (--no-vmm-jail): each VMM sees the host's file system and processes; a VMM escape reaches everything its uid can"
		return c
	}
	if os.Geteuid() != 0 {
		c.Detail = "needs root"
		return c
	}
	for _, ns := range []string{"mnt", "pid", "ipc", "uts"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			c.Detail = "no " + ns + " namespace: " + err.Error()
			return c
		}
	}
	h, err := cgroup.Detect()
	if err != nil {
		c.Detail = "cgroups: " + err.Error()
		return c
	}
	c.OK, c.Detail = true, "each VMM in its own mount, PID, IPC and UTS namespaces, private root, no_new_privs, reduced capabilities, "+strconv.Itoa(jailNoFile)+" descriptors, and a cgroup of its own ("+h.Mode.String()+")"
	return c
}

// tunCheck opens /dev/net/tun as netns does to create each sandbox's tap
// (an open without TUNSETIFF creates nothing): a node without the tun
// driver behind it fails here too, not only a missing node.
func tunCheck() vmm.Check {
	c := vmm.Check{Name: "tun device", Fix: netns.TunFix}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	f.Close()
	c.OK, c.Detail = true, "/dev/net/tun opens (sandbox networking)"
	return c
}

func userfaultfdCheck() vmm.Check {
	c := vmm.Check{
		Name: "userfaultfd",
		Fix:  "use Linux 5.11+ with CONFIG_USERFAULTFD, run forkd as root or set sysctl vm.unprivileged_userfaultfd=1",
	}
	var notes []string
	if _, err := os.Stat("/dev/userfaultfd"); err == nil {
		c.OK = true
		notes = append(notes, "/dev/userfaultfd present")
	}
	if b, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); err == nil {
		v := strings.TrimSpace(string(b))
		notes = append(notes, "vm.unprivileged_userfaultfd="+v)
		if v == "1" || os.Geteuid() == 0 {
			c.OK = true
		}
	}
	if len(notes) == 0 {
		notes = append(notes, "no /dev/userfaultfd and no vm.unprivileged_userfaultfd sysctl")
	}
	// QEMU runs unprivileged: 8.1+ in its jail opens a /dev/userfaultfd of
	// its own uid; 7.2 uses the syscall and needs the sysctl.
	notes = append(notes, "live branches: `forkd serve --live-branch` (clone memory on tmpfs; with QEMU 7.2 or --no-vmm-jail the sysctl is set to 1)")
	c.Detail = strings.Join(notes, ", ")
	return c
}

func orErr(s string, err error) string {
	if err != nil {
		return err.Error()
	}
	return s
}
