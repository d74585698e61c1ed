package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// threadNS is the calling thread's own network namespace.
const threadNS = "/proc/thread-self/ns/net"

// DoPath runs fn on a fresh goroutine locked to an OS thread that has been
// switched into the network namespace at path (a bind mount such as
// /run/netns/x, or /proc/PID/ns/net). Processes started by fn inherit the
// namespace (the fork happens on that thread).
//
// The thread is switched back before it is released. If that fails, the
// goroutine exits still locked, and the Go runtime then ends the thread
// instead of reusing it in the wrong namespace. (A child started with
// Pdeathsig would receive its signal then: the signal follows the thread.)
func DoPath(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("netns %s: %w", path, errdefs.ErrNotFound)
		}
		return fmt.Errorf("netns %s: %w", path, err)
	}
	defer unix.Close(target)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(threadNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: open own namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: setns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("netns: restore thread namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// mountDir guards making MountDir a shared mount point, done once per
// process (every namespace created after shares it).
var mountDir struct {
	sync.Mutex
	ready bool
}

// prepareMountDir makes MountDir a shared mount point, as iproute2 does, so
// that namespace mounts propagate into mount namespaces created later.
func prepareMountDir() error {
	mountDir.Lock()
	defer mountDir.Unlock()
	if mountDir.ready {
		return nil
	}
	if err := os.MkdirAll(MountDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", MountDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: bind it onto itself first.
		if err := unix.Mount(MountDir, MountDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", MountDir, err)
		}
		err = unix.Mount("", MountDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", MountDir, err)
	}
	mountDir.ready = true
	return nil
}

// createNamed makes a new network namespace, bind-mounts it at
// MountDir/name and runs inside (if not nil) in it, all on one thread
// that then switches back, leaving every thread of this process where it
// was.
func createNamed(name string, inside func() error) error {
	if err := prepareMountDir(); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	path := MountDir + "/" + name
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("netns %s: %w", name, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("netns %s: %w", name, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(threadNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		ferr := unix.Mount(threadNS, path, "none", unix.MS_BIND, "")
		if ferr != nil {
			ferr = fmt.Errorf("bind mount: %w", ferr)
		} else if inside != nil {
			ferr = inside()
		}
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("restore thread namespace: %w", err))
			return // still locked: the thread exits
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	if err := <-errc; err != nil {
		unmountNamed(path)
		os.Remove(path)
		return fmt.Errorf("netns %s: %w", name, err)
	}
	return nil
}

// mounted reports whether path is a namespace bind mount.
func mounted(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

func unmountNamed(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", path, err)
}

// disableIPv6 turns IPv6 off in the calling thread's network namespace,
// for the devices there and those made later (a sandbox's tap and its
// uplink's inner end). Sandbox networking is IPv4 only: with IPv6 on, each
// device would get a link-local address, duplicate address detection,
// router solicitations and multicast reports (timers and packets for
// nothing), and a guest a second protocol its egress rules do not cover.
// A kernel without IPv6 has nothing to turn off.
func disableIPv6() error {
	for _, conf := range []string{"all", "default"} {
		p := "/proc/sys/net/ipv6/conf/" + conf + "/disable_ipv6"
		if err := os.WriteFile(p, []byte("1\n"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("disable IPv6: %w", err)
		}
	}
	return nil
}
