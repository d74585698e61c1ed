package qemu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// These tests need neither root nor a guest.

func TestRegistered(t *testing.T) {
	if !slices.Contains(vmm.List(), Name) {
		t.Fatalf("drivers %v lack %q", vmm.List(), Name)
	}
	c, err := vmm.Lookup(Name)
	if err != nil || c.New == nil || c.Checks == nil {
		t.Fatalf("lookup: %+v, %v", c, err)
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]string{
		"QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022 Fabrice Bellard and the QEMU Project developers\n": "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)",
		"QEMU emulator version 9.0.0\nCopyright ...": "9.0.0",
	} {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseVersion("Firecracker v1.7.0"); err == nil {
		t.Error("accepted a non-QEMU version")
	}
}

func TestParseMHz(t *testing.T) {
	for in, want := range map[string]int64{"2596.124": 2596124, "3000": 3000000, "1999.9": 1999900, "2400.0004": 2400000} {
		if got, err := parseMHzToKHz(in); err != nil || got != want {
			t.Errorf("parseMHzToKHz(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-5", "12.ab"} {
		if _, err := parseMHzToKHz(in); err == nil {
			t.Errorf("parseMHzToKHz(%q) succeeded", in)
		}
	}
	if k, err := hostTSCKHz(); err != nil || k < 100000 {
		t.Errorf("host TSC = %d kHz, %v", k, err)
	}
}

func baseLaunch() *launch {
	return &launch{
		cfg: vmm.MachineConfig{
			ID: "abc", RunDir: "/run/forkd/abc", MemoryMiB: 512, VCPUs: 2,
			Image:      vmm.Image{Kernel: "/k/vmlinuz", Initrd: "/k/initrd", Rootfs: "/img/root,fs.ext4", KernelArgs: []string{"forkd.x=1"}},
			ConsoleLog: "/run/forkd/abc/console.log",
			MemoryFile: "/dev/shm/t.mem",
			VMGenID:    "324e6eaf-d1d1-4bf6-bf41-b9bb6c91fb87",
		},
		accel: vmm.AccelTCG, cpu: "max", tbSize: 64, tscKHz: 2596124,
	}
}

// argAfter returns the argument following the first flag whose value
// starts with prefix.
func argAfter(args []string, flag, prefix string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && strings.HasPrefix(args[i+1], prefix) {
			return args[i+1]
		}
	}
	return ""
}

func TestArgsTemplate(t *testing.T) {
	a := baseLaunch().args()
	check := func(flag, want string) {
		t.Helper()
		if got := argAfter(a, flag, want); got != want {
			t.Errorf("%s: want %q in %q", flag, want, a)
		}
	}
	check("-M", "microvm,x-option-roms=on,isa-serial=on,rtc=on,memory-backend=mem")
	check("-accel", "tcg,tb-size=64")
	check("-cpu", "max")
	check("-smp", "2")
	check("-m", "512M")
	check("-object", "memory-backend-file,id=mem,size=512M,mem-path=/dev/shm/t.mem,share=on")
	check("-append", "console=ttyS0 panic=-1 reboot=t quiet tsc_early_khz=2596124 tsc=reliable no_timer_check forkd.x=1")
	check("-drive", "file=/img/root,,fs.ext4,format=raw,if=none,id=d0,readonly=on")
	check("-device", "virtio-blk-device,drive=d0")
	check("-chardev", "socket,id=con,fd=3,server=on,wait=off")
	check("-chardev", "socket,id=agent,path=/run/forkd/abc/agent.sock,server=on,wait=off")
	check("-device", "virtserialport,chardev=agent,name=agent")
	check("-qmp", "unix:/run/forkd/abc/qmp.sock,server=on,wait=off")
	check("-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	for _, flag := range []string{"-nodefaults", "-no-user-config", "-nographic", "-no-reboot"} {
		if !slices.Contains(a, flag) {
			t.Errorf("missing %s", flag)
		}
	}
	for _, absent := range []string{"-incoming", "-netdev", "-runas"} {
		if slices.Contains(a, absent) {
			t.Errorf("unexpected %s", absent)
		}
	}
	if strings.Contains(strings.Join(a, " "), "vmgenid") {
		t.Error("vmgenid device on microvm")
	}
}

func TestArgsClone(t *testing.T) {
	l := baseLaunch()
	l.incoming = true
	l.runAs = "nobody"
	l.cfg.Network = &vmm.Network{NetNSPath: "/run/netns/forkd-abc", TapName: "tap0", MAC: "06:00:ac:1f:00:02"}
	a := l.args()
	for flag, want := range map[string]string{
		"-object":   "memory-backend-file,id=mem,size=512M,mem-path=/dev/shm/t.mem,share=off",
		"-incoming": "defer",
		"-netdev":   "tap,id=n0,ifname=tap0,script=no,downscript=no",
		"-runas":    "nobody",
		"-sandbox":  "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny",
	} {
		if got := argAfter(a, flag, want); got != want {
			t.Errorf("%s: want %q in %q", flag, want, a)
		}
	}
	if argAfter(a, "-device", "virtio-net-device,netdev=n0,mac=06:00:ac:1f:00:02") == "" {
		t.Errorf("no NIC in %q", a)
	}
	// A clone never boots: no initramfs for QEMU to keep in memory.
	if slices.Contains(a, "-initrd") {
		t.Errorf("clone gets -initrd: %q", a)
	}
}

func TestArgsKVM(t *testing.T) {
	l := baseLaunch()
	l.accel, l.cpu = vmm.AccelKVM, "host"
	l.cfg.MemoryFile = ""
	a := l.args()
	if argAfter(a, "-accel", "kvm") != "kvm" || argAfter(a, "-cpu", "host") != "host" {
		t.Errorf("kvm args %q", a)
	}
	if argAfter(a, "-M", "microvm") != "microvm,x-option-roms=on,isa-serial=on,rtc=on" || argAfter(a, "-object", "") != "" {
		t.Errorf("anonymous memory args %q", a)
	}
	if strings.Contains(l.kernelArgs(), "tsc") {
		t.Errorf("TCG kernel args under KVM: %q", l.kernelArgs())
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("k"), 0o644)
	mem := filepath.Join(dir, "mem")
	os.WriteFile(mem, make([]byte, 1<<20), 0o600)
	good := func() vmm.MachineConfig {
		return vmm.MachineConfig{ID: "x", RunDir: dir, MemoryMiB: 1, Image: vmm.Image{Kernel: kernel}}
	}
	c := good()
	if err := validate(&c, false); err != nil {
		t.Fatal(err)
	}
	if c.VCPUs != 1 || c.ConsoleLog != filepath.Join(dir, consoleFile) {
		t.Errorf("defaults: %+v", c)
	}
	for name, tc := range map[string]struct {
		mod      func(*vmm.MachineConfig)
		incoming bool
		is       func(error) bool
	}{
		"no id":                {func(c *vmm.MachineConfig) { c.ID = "" }, false, errdefs.IsInvalidArgument},
		"no memory":            {func(c *vmm.MachineConfig) { c.MemoryMiB = 0 }, false, errdefs.IsInvalidArgument},
		"missing kernel":       {func(c *vmm.MachineConfig) { c.Image.Kernel = kernel + "x" }, false, errdefs.IsNotFound},
		"long run dir":         {func(c *vmm.MachineConfig) { c.RunDir = "/" + strings.Repeat("d", 120) }, false, errdefs.IsInvalidArgument},
		"tap name":             {func(c *vmm.MachineConfig) { c.Network = &vmm.Network{} }, false, errdefs.IsInvalidArgument},
		"template exists":      {func(c *vmm.MachineConfig) { c.MemoryFile = mem }, false, errdefs.IsAlreadyExists},
		"clone memory missing": {func(c *vmm.MachineConfig) { c.MemoryFile = mem + "x" }, true, errdefs.IsNotFound},
		"clone memory size":    {func(c *vmm.MachineConfig) { c.MemoryFile = mem; c.MemoryMiB = 2 }, true, errdefs.IsInvalidArgument},
	} {
		c := good()
		tc.mod(&c)
		if err := validate(&c, tc.incoming); !tc.is(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c = good()
	c.MemoryFile = mem
	if err := validate(&c, true); err != nil {
		t.Errorf("clone of a 1 MiB template: %v", err)
	}
}

func TestSnapshotArguments(t *testing.T) {
	m := &Machine{cfg: vmm.MachineConfig{ID: "x", MemoryFile: "/dev/shm/m"}}
	ctx := context.Background()
	if _, err := m.Snapshot(ctx, vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: "s", StopAfter: true}); !errdefs.IsNotImplemented(err) {
		t.Errorf("diff: %v", err)
	}
	if _, err := m.Snapshot(ctx, vmm.SnapshotSpec{StateFile: "s"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("shared RAM without StopAfter: %v", err)
	}
	if _, err := m.Snapshot(ctx, vmm.SnapshotSpec{StopAfter: true}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no state file: %v", err)
	}
}

func TestChecks(t *testing.T) {
	checks := Checks(context.Background(), vmm.Options{})
	names := map[string]bool{}
	for _, c := range checks {
		names[c.Name] = true
		if c.Fix == "" {
			t.Errorf("check %q has no fix", c.Name)
		}
		t.Logf("%-16s ok=%v %s", c.Name, c.OK, c.Detail)
	}
	for _, n := range []string{"qemu binary", "kvm", "tun device", "userfaultfd", "vmm jail"} {
		if !names[n] {
			t.Errorf("no %q check", n)
		}
	}
	// A jail turned off is reported, never passed.
	for _, c := range Checks(context.Background(), vmm.Options{NoJail: true}) {
		if c.Name == "vmm jail" && (c.OK || !strings.Contains(c.Detail, "--no-vmm-jail")) {
			t.Errorf("jail off: %+v", c)
		}
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(Config{Binary: "/nonexistent/qemu"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("missing binary: %v", err)
	}
	if _, err := New(Config{Binary: "/bin/true", Accel: "hvf"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad accel: %v", err)
	}
	if _, err := New(Config{Binary: "/bin/true", RunAs: "no-such-user-forkd"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad user: %v", err)
	}
}

func TestPrepareRefusesUffdBackend(t *testing.T) {
	d, err := New(Config{Binary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Prepare(context.Background(), vmm.PrepareSpec{
		MachineConfig: vmm.MachineConfig{ID: "x", RunDir: t.TempDir()},
		StateFile:     "/nonexistent/state", MemoryBackend: vmm.MemoryBackendUffd, UffdSocket: "/run/x.sock",
	})
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "file backend") {
		t.Errorf("uffd backend: %v, want not implemented naming the file backend", err)
	}
}

func TestValidateRefusesOptionInjection(t *testing.T) {
	for _, n := range []vmm.Network{
		{TapName: "tap0", MAC: "06:00:ac:1f:00:02,romfile=/etc/shadow"},
		{TapName: "tap0,ifname=x", MAC: "06:00:ac:1f:00:02"},
	} {
		c := vmm.MachineConfig{ID: "x", RunDir: "/tmp/x", MemoryMiB: 64, VCPUs: 1, Network: &n}
		if err := validate(&c, true); !errdefs.IsInvalidArgument(err) {
			t.Errorf("network %+v: %v, want invalid argument", n, err)
		}
	}
}

// TestCanRestore: a snapshot restores only on the QEMU release (major and
// minor) that wrote it; 10.0 refuses 7.2's state.
func TestCanRestore(t *testing.T) {
	d := &Driver{version: "10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"}
	for _, ok := range []string{"10.0.2 (Debian 1:10.0.2+ds-2)", "10.0.7", ""} {
		if err := d.CanRestore(ok); err != nil {
			t.Errorf("CanRestore(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)", "10.1.0", "9.0.0"} {
		err := d.CanRestore(bad)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "forkd snapshot create") ||
			!strings.Contains(err.Error(), "this host runs QEMU 10.0.2") {
			t.Errorf("CanRestore(%q) = %v", bad, err)
		}
	}
	if err := (&Driver{versionErr: errdefs.ErrInternal}).CanRestore("7.2.22"); err != nil {
		t.Errorf("unknown own version: %v", err)
	}
}

func TestFeaturesOf(t *testing.T) {
	for v, want := range map[string]features{
		"7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)": {},
		"8.1.0": {uffdDevice: true},
		"8.2.2": {uffdDevice: true, readonlyRAM: true},
		"9.0.2": {uffdDevice: true, readonlyRAM: true},
		"9.1.0": {uffdDevice: true, readonlyRAM: true, runWith: true, fileMigration: true},
		"10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)": {uffdDevice: true, readonlyRAM: true, runWith: true, fileMigration: true},
		"": {},
	} {
		want.version = v
		if got := featuresOf(v); got != want {
			t.Errorf("featuresOf(%q) = %+v, want %+v", v, got, want)
		}
	}
}
