package boot

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Layout of the initramfs and of the root switch.
const (
	ModulesList = "/etc/forkd-modules"
	ModulesDir  = "/lib/modules"
	RootDevice  = "/dev/vda"
	AgentPort   = "agent" // name of the virtio-serial port

	lowerDir   = "/mnt/lower"
	rwDir      = "/mnt/rw"
	newRootDir = "/mnt/root"
)

// Bounds of the waits for devices. Module init probes virtio devices
// synchronously; the device nodes follow from devtmpfs within milliseconds.
const (
	diskWait = 5 * time.Second
	portWait = 10 * time.Second
	pollStep = 2 * time.Millisecond
)

// Result is what Init found.
type Result struct {
	// AgentPort is the device node of the agent's virtio-serial port; ""
	// when the channel is vsock (AgentVsock).
	AgentPort string
	// AgentVsock: the VM has a virtio vsock device and no agent port
	// (Firecracker); the agent listens on agentapi.VsockPort.
	AgentVsock bool
	// Overlay is true when the root is the disk's overlay; false when the
	// agent stayed in the initramfs (no disk).
	Overlay bool
	// Upper is the overlay's upper directory (what the guest changed),
	// opened before the root switch hid it: reach it as
	// /proc/self/fd/<Upper.Fd()>. Nil without Overlay.
	Upper   *os.File
	Cmdline Cmdline
}

// Init brings the VM up as described in the package documentation. Logf
// receives one line per step.
func Init(logf func(string, ...any)) (*Result, error) {
	t0 := time.Now()
	step := func(what string, start time.Time) {
		logf("%s (%v)", what, time.Since(start).Round(100*time.Microsecond))
	}

	start := time.Now()
	if err := mountEarly(); err != nil {
		return nil, err
	}
	ensureConsole()
	raw, _ := os.ReadFile("/proc/cmdline")
	cmd := ParseCmdline(string(raw))
	step("mounted /dev /proc /sys", start)

	start = time.Now()
	n, total := loadModules(ModulesList, ModulesDir, logf)
	step(fmt.Sprintf("loaded %d/%d kernel modules", n, total), start)

	start = time.Now()
	res := &Result{Cmdline: cmd}
	disk := hasVirtioBlock("/sys")
	if disk {
		if err := waitPath(RootDevice, diskWait); err != nil {
			return nil, fmt.Errorf("root disk: %w", err)
		}
	}
	port, vsock, err := findAgentChannel("/sys", "/dev", AgentPort, portWait)
	if err != nil {
		return nil, err
	}
	res.AgentVsock = vsock
	step(fmt.Sprintf("found agent channel %s, root disk %v", channelName(port, vsock), disk), start)

	if disk {
		start = time.Now()
		if err := mountOverlayRoot(); err != nil {
			return nil, err
		}
		// Opened now: after the switch the upper tmpfs is outside the root.
		if res.Upper, err = os.Open(filepath.Join(rwDir, "upper")); err != nil {
			return nil, fmt.Errorf("open the overlay's upper directory: %w", err)
		}
		if err := switchRoot(newRootDir); err != nil {
			return nil, err
		}
		res.Overlay = true
		step("switched root to "+RootDevice+" (read-only) + tmpfs overlay", start)
	} else {
		logf("no root disk: staying in the initramfs (no /bin/sh; exec needs a root file system)")
	}

	start = time.Now()
	if err := mountSystem(res.Overlay); err != nil {
		return nil, err
	}
	// The node may have a new path in the new /dev; it is the same device.
	res.AgentPort = port
	step("mounted proc sys dev devpts shm tmp run", start)

	start = time.Now()
	if err := setupNetwork(cmd, logf); err != nil {
		logf("network: %v", err) // a sandbox without network still serves
	}
	hostname := cmd.Get(ParamHostname, "forkd")
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		logf("hostname %q: %v", hostname, err)
	}
	step("network and hostname "+hostname, start)
	logf("boot done in %v", time.Since(t0).Round(100*time.Microsecond))
	return res, nil
}

// mount mounts, creating the mount point; an already-mounted target
// (EBUSY) is fine.
func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", target, err)
	}
	if err := unix.Mount(src, target, fstype, flags, data); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount %s on %s (%s): %w", src, target, fstype, err)
	}
	return nil
}

func mountEarly() error {
	for _, m := range []struct{ src, target, fs string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := mount(m.src, m.target, m.fs, unix.MS_NOSUID, ""); err != nil {
			return err
		}
	}
	return nil
}

// ensureConsole gives the agent stdin/stdout/stderr on /dev/console if the
// kernel could not (no /dev/console in the initramfs when init started).
func ensureConsole() {
	if _, err := unix.FcntlInt(2, unix.F_GETFD, 0); err == nil {
		return
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for i := 0; i <= 2; i++ {
		if i != fd {
			_ = unix.Dup3(fd, i, 0)
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// MODULE_INIT_COMPRESSED_FILE: the kernel decompresses (5.17+).
const moduleInitCompressedFile = 4

// loadModules loads the modules named in list, in order.
func loadModules(list, dir string, logf func(string, ...any)) (loaded, total int) {
	f, err := os.Open(list)
	if err != nil {
		logf("no module list (%v): relying on built-in drivers", err)
		return 0, 0
	}
	names, err := ParseModuleList(f)
	f.Close()
	if err != nil {
		logf("reading %s: %v", list, err)
	}
	for _, name := range names {
		if err := loadModule(filepath.Join(dir, filepath.Base(name))); err != nil {
			logf("module %s: %v", name, err)
			continue
		}
		loaded++
	}
	return loaded, len(names)
}

func loadModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags := 0
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		if strings.HasSuffix(path, ext) {
			flags |= moduleInitCompressedFile
		}
	}
	if err := unix.FinitModule(fd, "", flags); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// hasVirtioBlock reports whether a virtio block device (device id 2) is on
// the virtio bus.
func hasVirtioBlock(sys string) bool {
	ids, _ := filepath.Glob(filepath.Join(sys, "bus/virtio/devices/*/device"))
	for _, p := range ids {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == "0x0002" {
			return true
		}
	}
	return false
}

func waitPath(p string, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", p, bound)
		}
		time.Sleep(pollStep)
	}
}

// findAgentChannel finds the agent's channel, waiting up to bound: the
// device node of the virtio-serial port called name
// (/sys/class/virtio-ports/vportNpM/name) under QEMU, or, in a VM with a
// virtio vsock device bound to its driver and no such port (Firecracker),
// vsock.
func findAgentChannel(sys, dev, name string, bound time.Duration) (port string, vsock bool, err error) {
	deadline := time.Now().Add(bound)
	for {
		if p, ok := lookupPort(sys, dev, name); ok {
			if _, err := os.Stat(p); err == nil {
				return p, false, nil
			}
		}
		if hasVirtioVsock(sys) {
			return "", true, nil
		}
		if time.Now().After(deadline) {
			return "", false, fmt.Errorf("no virtio-serial port named %q and no vsock device within %v (is virtio_console loaded and the VM given -device virtserialport,name=%s, or a vsock device with vmw_vsock_virtio_transport?)", name, bound, name)
		}
		time.Sleep(pollStep)
	}
}

// hasVirtioVsock reports a virtio vsock device bound to its driver.
func hasVirtioVsock(sys string) bool {
	devs, _ := filepath.Glob(filepath.Join(sys, "bus/virtio/drivers/vmw_vsock_virtio_transport/virtio*"))
	return len(devs) > 0
}

func channelName(port string, vsock bool) string {
	if vsock {
		return "vsock"
	}
	return port
}

func lookupPort(sys, dev, name string) (string, bool) {
	names, _ := filepath.Glob(filepath.Join(sys, "class/virtio-ports/*/name"))
	for _, p := range names {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == name {
			return filepath.Join(dev, filepath.Base(filepath.Dir(p))), true
		}
	}
	return "", false
}

func mountOverlayRoot() error {
	if err := mount(RootDevice, lowerDir, "ext4", unix.MS_RDONLY, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", rwDir, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(rwDir, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowerDir, rwDir, rwDir)
	return mount("overlay", newRootDir, "overlay", 0, opts)
}

// switchRoot makes dir the root. The initramfs is rootfs, which cannot be
// pivot_root'ed away: move the new root onto / and chroot into it. The
// early /dev, /proc and /sys are detached first; fresh ones are mounted in
// the new root.
func switchRoot(dir string) error {
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move %s to /: %w", dir, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	return unix.Chdir("/")
}

// mountSystem mounts the API file systems of the final root. In the
// initramfs, /dev, /proc and /sys are already there.
func mountSystem(fresh bool) error {
	type m struct {
		src, target, fs string
		flags           uintptr
		data            string
	}
	var ms []m
	if fresh {
		ms = append(ms,
			m{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
			m{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
			m{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		)
	}
	ms = append(ms,
		m{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,ptmxmode=0666,gid=5"},
		m{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		m{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		m{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	)
	for _, x := range ms {
		if err := mount(x.src, x.target, x.fs, x.flags, x.data); err != nil {
			return err
		}
	}
	// devtmpfs has no /dev/fd and friends; shells (process substitution)
	// and many programs expect them.
	for link, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		if _, err := os.Lstat(link); err != nil {
			_ = os.Symlink(target, link)
		}
	}
	return nil
}

// setupNetwork brings lo up and configures eth0 from the command line.
func setupNetwork(cmd Cmdline, logf func(string, ...any)) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	eth, err := netlink.LinkByName("eth0")
	if err != nil {
		logf("no eth0: no network")
		return nil
	}
	ip := cmd[ParamIP]
	if ip == "" {
		logf("eth0 present but no %s= on the kernel command line: left down", ParamIP)
		return nil
	}
	addr, err := netlink.ParseAddr(ip)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", ParamIP, ip, err)
	}
	if err := netlink.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("eth0 address %s: %w", ip, err)
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if gw := cmd[ParamGateway]; gw != "" {
		gwIP := net.ParseIP(gw)
		if gwIP == nil {
			return fmt.Errorf("%s=%q is not an IP address", ParamGateway, gw)
		}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gwIP}); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	if dns := cmd[ParamDNS]; dns != "" {
		if net.ParseIP(dns) == nil {
			return fmt.Errorf("%s=%q is not an IP address", ParamDNS, dns)
		}
		// /etc/resolv.conf may be a dangling symlink (systemd-resolved's)
		// in a Debian root: replace it.
		_ = os.Remove("/etc/resolv.conf")
		if err := os.WriteFile("/etc/resolv.conf", []byte("nameserver "+dns+"\n"), 0o644); err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
	}
	logf("eth0 %s gw %q", ip, cmd[ParamGateway])
	return nil
}
