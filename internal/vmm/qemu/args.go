package qemu

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/vmm"
)

// Names of the run files inside MachineConfig.RunDir.
const (
	qmpSocket     = "qmp.sock"
	agentSocket   = "agent.sock"
	consoleSocket = "console.sock" // the serial console's (consolelog.go)
	consoleFile   = "console.log"
	stderrFile    = "qemu.log"
	pidFile       = "qemu.pid"
)

// maxSocketPath is the longest unix socket path (sun_path holds 108 bytes
// including the terminating NUL).
const maxSocketPath = 107

// launch is everything that decides a QEMU command line.
type launch struct {
	cfg      vmm.MachineConfig
	accel    vmm.Accel // resolved: kvm or tcg
	cpu      string    // -cpu model
	tbSize   int       // MiB; 0 leaves QEMU's default
	tscKHz   int64     // host TSC frequency, for the TCG kernel arguments
	incoming bool      // Prepare: wait in -incoming defer
	runAs    string    // user to drop to (-runas or -run-with user=), "" for none
	uid      int       // runAs's uid when it is one of the driver's (uids.go), else 0
	feat     features
}

// memShared reports whether guest RAM is a shared mapping of the memory
// file (a template booted with Boot) rather than a private one (a clone).
func (l *launch) memShared() bool { return l.cfg.MemoryFile != "" && !l.incoming }

// kernelArgs is the guest kernel command line.
func (l *launch) kernelArgs() string {
	// panic=-1 reboots at once on a guest panic and -no-reboot turns the
	// reset into QEMU's exit. reboot=t makes that reset a triple fault,
	// which QEMU always sees: with the kernel's default order (ACPI reset
	// register, keyboard controller, EFI, BIOS) the ACPI reset did not
	// always take on microvm, and the fallbacks (no i8042 here) ended in
	// a jump to the firmware that QEMU does not see as a reset: the guest
	// then hung in a reboot loop and QEMU never exited (6 of 6 clones in
	// one measurement, intermittently in others).
	args := []string{"console=ttyS0", "panic=-1", "reboot=t", "quiet"}
	if l.accel == vmm.AccelTCG {
		// Under TCG the kernel's TSC calibration against the PIT fails
		// and most boots hang; give it the frequency (the guest TSC runs
		// at the host's rate under TCG) and trust it.
		if l.tscKHz > 0 {
			args = append(args, "tsc_early_khz="+strconv.FormatInt(l.tscKHz, 10))
		}
		args = append(args, "tsc=reliable", "no_timer_check")
	}
	return strings.Join(append(args, l.cfg.Image.KernelArgs...), " ")
}

// args builds QEMU's arguments (without the binary).
func (l *launch) args() []string {
	c := l.cfg
	run := func(name string) string { return filepath.Join(c.RunDir, name) }
	machine := "microvm,x-option-roms=on,isa-serial=on,rtc=on"
	if c.MemoryFile != "" {
		machine += ",memory-backend=mem"
	}
	accel := string(l.accel)
	if l.accel == vmm.AccelTCG && l.tbSize > 0 {
		accel += ",tb-size=" + strconv.Itoa(l.tbSize)
	}
	a := []string{
		"-name", "forkd-" + c.ID,
		"-M", machine,
		"-accel", accel,
		"-cpu", l.cpu,
		"-smp", strconv.Itoa(c.VCPUs),
		"-m", fmt.Sprintf("%dM", c.MemoryMiB),
		"-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-no-reboot",
	}
	if c.MemoryFile != "" {
		// share=on: the template's RAM is the file itself. share=off:
		// MAP_PRIVATE, so a clone's writes are copied, never written back.
		share := "off"
		if l.memShared() {
			share = "on"
		}
		ro := ""
		if !l.memShared() && l.feat.readonlyRAM {
			// The file is opened read-only and mapped private and
			// writable: the clone's VMM holds no descriptor that can
			// write the template.
			ro = ",readonly=on,rom=off"
		}
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s%s",
			c.MemoryMiB, optEscape(c.MemoryFile), share, ro))
	}
	a = append(a, "-kernel", c.Image.Kernel)
	// A clone never boots, and QEMU would read the whole initramfs into a
	// buffer it keeps for the life of the process (8 MB for py-pandas), as
	// with the kernel (see restoreKernel): clones get none. The initramfs
	// is not part of the migrated state.
	if c.Image.Initrd != "" && !l.incoming {
		a = append(a, "-initrd", c.Image.Initrd)
	}
	a = append(a, "-append", l.kernelArgs())
	if c.Image.Rootfs != "" {
		drive := "file=" + optEscape(c.Image.Rootfs) + ",format=raw,if=none,id=d0,readonly=on"
		// QEMU's block throttling: a leaky bucket per second, with a
		// burst of one second's worth (QEMU's default).
		if r := c.DiskRead.BytesPerSec; r > 0 {
			drive += ",throttling.bps-read=" + strconv.FormatInt(r, 10)
		}
		if r := c.DiskRead.OpsPerSec; r > 0 {
			drive += ",throttling.iops-read=" + strconv.FormatInt(r, 10)
		}
		a = append(a, "-drive", drive, "-device", "virtio-blk-device,drive=d0")
	}
	a = append(a,
		// The listening socket QEMU inherits, bound by start: see
		// consolelog.go for why QEMU does not write the console itself.
		"-chardev", "socket,id=con,fd="+strconv.Itoa(consoleFD)+",server=on,wait=off",
		"-serial", "chardev:con",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path="+optEscape(run(agentSocket))+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=agent",
	)
	if n := c.Network; n != nil {
		a = append(a, "-netdev", "tap,id=n0,ifname="+optEscape(n.TapName)+",script=no,downscript=no")
		dev := "virtio-net-device,netdev=n0"
		if n.MAC != "" {
			dev += ",mac=" + n.MAC
		}
		a = append(a, "-device", dev)
	}
	// No vmgenid device, whatever MachineConfig.VMGenID says: see
	// "Clones and vmgenid" in the package doc.
	a = append(a, "-qmp", "unix:"+optEscape(run(qmpSocket))+",server=on,wait=off")
	if l.incoming {
		a = append(a, "-incoming", "defer")
	}
	// seccomp: no obsolete syscalls, no spawning (hence no exec:
	// migration), no scheduler/affinity changes. QEMU installs the filter
	// before -runas drops privileges, so with elevateprivileges=deny its
	// own setgid/setuid is killed (SIGSYS); once dropped to an
	// unprivileged user for good (real, effective and saved ids), there
	// is nothing left to elevate to, so allowing those calls loses little.
	elevate := "deny"
	if l.runAs != "" {
		elevate = "allow"
	}
	a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges="+elevate+",spawn=deny,resourcecontrol=deny")
	switch {
	case l.runAs == "":
	case l.feat.runWith:
		a = append(a, "-run-with", "user="+optEscape(l.runAs))
	default:
		a = append(a, "-runas", l.runAs)
	}
	return a
}

// optEscape escapes a value for QEMU's option syntax, where a comma
// separates options and ",," is a literal comma.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }
