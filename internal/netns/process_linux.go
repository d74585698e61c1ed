package netns

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/procfs"
)

// Process names one process across PID reuse: its PID and its start time
// (field 22 of /proc/PID/stat, in clock ticks since boot).
type Process struct {
	PID       int
	StartTime uint64
}

// OpenProcess names the network namespace that process p lives in as name,
// in this process's mount namespace, and returns it: the way back into the
// namespace of a sandbox whose VMM an earlier daemon started.
//
// A name is only a bind mount in the mount namespace that made it. A
// daemon restarted in a fresh mount namespace (a systemd service with
// ProtectSystem= or PrivateTmp=, which gets a private one each start) does
// not see its predecessor's names; the VMM, which lives in the namespace,
// is what leads back to it. So the namespace is opened at
// /proc/PID/ns/net, p is checked to still hold the PID (its start time,
// read after the open: a process that held the PID all along opened it),
// and want, when not zero, must be the namespace's inode (NS.Inode, as
// recorded when the namespace was made): a VMM that is not in its
// sandbox's namespace is refused. Without want, the daemon's own
// namespace is refused: a sandbox never lives there.
//
// An existing name for the same namespace is kept; one for another (stale,
// or a mistake) is replaced. It fails with errdefs.ErrNotFound when p is
// gone, errdefs.ErrFailedPrecondition when it lives in the wrong namespace.
func OpenProcess(name string, p Process, want uint64) (*NS, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("netns %s: pid %d: %s", name, p.PID, fmt.Sprintf(format, args...))
	}
	if p.PID <= 0 || p.StartTime == 0 {
		return nil, fmt.Errorf("%w: %w", fail("need a PID and a start time (got start %d)", p.StartTime), errdefs.ErrInvalidArgument)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(p.PID) + "/ns/net")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("%w: %w", fail("no such process"), errdefs.ErrNotFound)
		}
		return nil, fail("%v", err)
	}
	defer f.Close()
	st, err := procfs.ReadStat(p.PID)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", fail("no such process (%v)", err), errdefs.ErrNotFound)
	case st.StartTime != p.StartTime:
		return nil, fmt.Errorf("%w: %w", fail("the PID now belongs to another process (started at clock tick %d, not %d)", st.StartTime, p.StartTime), errdefs.ErrNotFound)
	case st.Exited():
		return nil, fmt.Errorf("%w: %w", fail("the process has exited"), errdefs.ErrNotFound)
	}
	ino, err := fdInode(f)
	if err != nil {
		return nil, fail("%v", err)
	}
	if want != 0 && ino != want {
		return nil, fmt.Errorf("%w: %w", fail("the process is in network namespace %d, not in the sandbox's (%d)", ino, want), errdefs.ErrFailedPrecondition)
	}
	if want == 0 {
		own, err := pathInode("/proc/self/ns/net")
		if err != nil {
			return nil, fail("%v", err)
		}
		if ino == own {
			return nil, fmt.Errorf("%w: %w", fail("the process is in the daemon's own network namespace, not in a sandbox's"), errdefs.ErrFailedPrecondition)
		}
	}
	ns := &NS{name: name, tap: DefaultTap, ino: ino}
	if err := bindName(name, f, ino); err != nil {
		return nil, err
	}
	return ns, nil
}

// bindName makes MountDir/name a bind mount of the namespace open as f
// (inode ino), unless it already is one.
func bindName(name string, f *os.File, ino uint64) error {
	path := MountDir + "/" + name
	if mounted(path) {
		if got, err := pathInode(path); err == nil && got == ino {
			return nil
		}
		// A name left for another namespace: the process wins.
		if err := unmountNamed(path); err != nil {
			return fmt.Errorf("netns %s: replace stale name: %w", name, err)
		}
	}
	if err := prepareMountDir(); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	mp, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	mp.Close()
	// The open file, not /proc/PID/ns/net again: the PID was checked
	// against this file's process, and could be another one's by now.
	src := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("netns %s: bind mount: %w", name, err)
	}
	if got, err := pathInode(path); err != nil || got != ino {
		unmountNamed(path)
		os.Remove(path)
		return fmt.Errorf("netns %s: the bind mount is namespace %d, not %d (%v)", name, got, ino, err)
	}
	return nil
}

// Inode is the namespace's inode number: it tells namespaces apart while
// they exist (as `ip netns identify` and `lsns` do). 0 if unknown.
func (ns *NS) Inode() uint64 { return ns.ino }

func fdInode(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func pathInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
