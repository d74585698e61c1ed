package netns

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// startInside starts a process that lives in ns, as a VMM does, and
// returns its identity.
func startInside(t *testing.T, ns *NS) Process {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	st, err := procfs.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return Process{PID: cmd.Process.Pid, StartTime: st.StartTime}
}

// TestOpenProcess: a namespace whose name is gone (as for a daemon
// restarted in a new mount namespace) is named again from a process that
// lives in it, and only from the right process in the right namespace.
func TestOpenProcess(t *testing.T) {
	testutil.RequiresRoot(t)
	name := testName(t)
	ns, err := Create(context.Background(), name, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	if ns.Inode() == 0 {
		t.Fatal("Create: no inode")
	}
	p := startInside(t, ns)
	// The name goes; the namespace lives on in the process.
	if err := ns.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(name, ""); !errdefs.IsNotFound(err) {
		t.Fatalf("Open after Remove: %v", err)
	}

	// The wrong process, the wrong start time, the wrong namespace: no.
	if _, err := OpenProcess(name, Process{PID: os.Getpid(), StartTime: p.StartTime}, ns.Inode()); !errdefs.IsNotFound(err) {
		t.Errorf("OpenProcess of a process with another start time: %v", err)
	}
	if _, err := OpenProcess(name, p, ns.Inode()+1); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("OpenProcess with another recorded namespace: %v", err)
	}
	self, err := procfs.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenProcess(name, Process{PID: os.Getpid(), StartTime: self.StartTime}, 0); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("OpenProcess of a process in the daemon's own namespace: %v", err)
	}
	if _, err := os.Stat(MountDir + "/" + name); !os.IsNotExist(err) {
		t.Fatalf("a refused OpenProcess left a name: %v", err)
	}

	// The right one: named again, the same namespace.
	got, err := OpenProcess(name, p, ns.Inode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Inode() != ns.Inode() || got.Name() != name || got.TapName() != DefaultTap {
		t.Fatalf("OpenProcess = %s inode %d tap %s; want %s inode %d", got.Name(), got.Inode(), got.TapName(), name, ns.Inode())
	}
	if byName, err := Open(name, ""); err != nil || byName.Inode() != ns.Inode() {
		t.Fatalf("Open by the new name: inode %v, %v", byName, err)
	}
	// Its tap is there: it is the sandbox's namespace, entered by name.
	if err := got.Do(func() error {
		ifr, err := unix.NewIfreq(DefaultTap)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr)
	}); err != nil {
		t.Fatalf("the tap in the renamed namespace: %v", err)
	}
	// Again: the name is kept; for another namespace it is replaced.
	if _, err := OpenProcess(name, p, ns.Inode()); err != nil {
		t.Fatalf("OpenProcess with the name in place: %v", err)
	}
	other, err := Create(context.Background(), name+"-o", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Remove() })
	q := startInside(t, other)
	again, err := OpenProcess(name, q, other.Inode())
	if err != nil {
		t.Fatalf("OpenProcess over a name for another namespace: %v", err)
	}
	if byName, err := Open(name, ""); err != nil || byName.Inode() != other.Inode() || again.Inode() != other.Inode() {
		t.Fatalf("the name after replacing: %v, %v; want inode %d", byName, err, other.Inode())
	}
	if err := again.Remove(); err != nil {
		t.Fatal(err)
	}
}
