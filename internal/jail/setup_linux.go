package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// run is the helper: it confines this process as raw's spec says and
// execs the VMM. It returns only on failure.
func run(raw string) error {
	// no_new_privs and the bounding set are per thread: set them on the
	// thread that execs.
	runtime.LockOSThread()
	var s struct {
		Spec
		Path string   `json:"path"`
		Args []string `json:"args"`
	}
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, specEnv+"=") })
	for _, dir := range s.Cgroups {
		// "0" is the writing process (all its threads).
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", dir, err)
		}
	}
	lastCap, err := lastCapability()
	if err != nil {
		return err
	}
	if err := build(&s.Spec); err != nil {
		return err
	}
	if err := enter(&s.Spec); err != nil {
		return err
	}
	if err := confine(&s.Spec, lastCap); err != nil {
		return err
	}
	if err := unix.Exec(s.Path, s.Args, env); err != nil {
		return fmt.Errorf("exec %s: %w", s.Path, err)
	}
	return nil
}

// build makes the jail's root under s.Root, in this process's own mount
// namespace (nothing propagates to the host).
func build(s *Spec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make this mount namespace private: %w", err)
	}
	root := s.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount the root tmpfs on %s: %w", root, err)
	}
	// A merged-/usr host's top-level links (/lib -> usr/lib, ...), so
	// that binaries find their loader and libraries under the /usr bind.
	for _, l := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		if target, err := os.Readlink(l); err == nil {
			if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
				return err
			}
		}
	}
	// /tmp first: binds of paths under /tmp then land on it.
	if s.TmpBytes > 0 {
		tmp := filepath.Join(root, "tmp")
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		opts := "mode=1777,size=" + strconv.FormatInt(s.TmpBytes, 10)
		if err := unix.Mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
			return fmt.Errorf("mount /tmp: %w", err)
		}
	}
	if err := makeOwnedDevices(root, s.OwnedDevices); err != nil {
		return err
	}
	binds := slices.Clone(s.Binds)
	for _, d := range s.Devices {
		binds = append(binds, Bind{Path: d, Writable: true})
	}
	// Parents first; a path inside an earlier bind is visible through it.
	slices.SortStableFunc(binds, func(a, b Bind) int { return len(a.Path) - len(b.Path) })
	var done []Bind
	for _, b := range binds {
		if cover, ok := covered(done, b.Path); ok {
			if (b.Writable && !cover.Writable) || (b.Exec && !cover.Exec) {
				return fmt.Errorf("%s needs more access than %s, which holds it", b.Path, cover.Path)
			}
			continue
		}
		if err := bind(root, b, slices.Contains(s.Devices, b.Path)); err != nil {
			return err
		}
		done = append(done, b)
	}
	proc := filepath.Join(root, "proc")
	if err := os.Mkdir(proc, 0o555); err != nil {
		return err
	}
	// This process is PID 1 of its own PID namespace: the new /proc shows
	// the jailed process alone.
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	return nil
}

// makeOwnedDevices makes each device node under root on a /dev tmpfs of
// its own: the root tmpfs is nodev, and device binds made later land on
// this one.
func makeOwnedDevices(root string, devs []OwnedDevice) error {
	if len(devs) == 0 {
		return nil
	}
	dev := filepath.Join(root, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devs {
		if filepath.Dir(d.Path) != "/dev" {
			return fmt.Errorf("owned device %q: only nodes directly under /dev", d.Path)
		}
		var st unix.Stat_t
		if err := unix.Stat(d.Path, &st); err != nil {
			return fmt.Errorf("owned device %s: %w", d.Path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return fmt.Errorf("owned device %s: not a character device", d.Path)
		}
		target := filepath.Join(root, d.Path)
		if err := unix.Mknod(target, unix.S_IFCHR|0o600, int(st.Rdev)); err != nil {
			return fmt.Errorf("owned device %s: mknod: %w", d.Path, err)
		}
		if err := unix.Chown(target, d.UID, d.GID); err != nil {
			return fmt.Errorf("owned device %s: %w", d.Path, err)
		}
	}
	return nil
}

// covered finds the bind among done whose directory holds path.
func covered(done []Bind, path string) (Bind, bool) {
	for _, d := range done {
		if path == d.Path || strings.HasPrefix(path, strings.TrimSuffix(d.Path, "/")+"/") {
			return d, true
		}
	}
	return Bind{}, false
}

// bind makes host path b.Path visible at the same path under root.
func bind(root string, b Bind, device bool) error {
	if !filepath.IsAbs(b.Path) {
		return fmt.Errorf("bind %q: not an absolute path", b.Path)
	}
	st, err := os.Stat(b.Path)
	if err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	target := filepath.Join(root, b.Path)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if st.IsDir() {
		err = os.Mkdir(target, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("bind %s: mount point: %w", b.Path, err)
	}
	if err := unix.Mount(b.Path, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", b.Path, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID)
	if !b.Writable {
		flags |= unix.MS_RDONLY
	}
	if !b.Exec {
		flags |= unix.MS_NOEXEC
	}
	if !device {
		flags |= unix.MS_NODEV
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s: set its flags: %w", b.Path, err)
	}
	return nil
}

// enter makes the built root this process's root (pivot_root) and drops
// the host's.
func enter(s *Spec) error {
	if err := unix.Chdir(s.Root); err != nil {
		return err
	}
	// The old root is stacked on the new one at "." and detached next:
	// no directory of the host's stays reachable.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root into %s: %w", s.Root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make the jail's root read-only: %w", err)
	}
	if s.Dir != "" {
		if err := unix.Chdir(s.Dir); err != nil {
			return fmt.Errorf("working directory %s: %w", s.Dir, err)
		}
	}
	return nil
}

// confine sets what the exec keeps: host name, rlimits, a reduced
// capability bounding set, no ambient capabilities and no_new_privs.
func confine(s *Spec, lastCap int) error {
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("host name: %w", err)
		}
	}
	for _, l := range s.RLimits {
		if err := unix.Setrlimit(l.Resource, &unix.Rlimit{Cur: l.Cur, Max: l.Max}); err != nil {
			return fmt.Errorf("rlimit %d: %w", l.Resource, err)
		}
	}
	for c := 0; c <= lastCap; c++ {
		if slices.Contains(s.KeepCaps, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}

// lastCapability is the highest capability number this kernel knows.
func lastCapability() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("capabilities: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
