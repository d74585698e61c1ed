package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/netns"
)

// TestWatchdog: once the bench run's end of the pipe closes (the run
// exited, SIGKILL included), its watchdog kills the run's VMMs and removes
// its run dir, namespaces and data-dir files, and only those.
func TestWatchdog(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(watchdogEnv, "1") // the watchdog is this test binary
	rootRun, rootData := t.TempDir(), t.TempDir()
	owner := os.Getpid() // the watchdog's owner is this process
	runDir := runDirOf(rootRun, "spawn", owner)
	otherRun := runDirOf(rootRun, "spawn", deadPID(t))
	dataDir := dataDirOf(rootData, "state", owner)
	for _, d := range []string{filepath.Join(runDir, "vms", "sb-1"), otherRun, dataDir} {
		os.MkdirAll(d, 0o755)
	}
	vmm := fakeVMM(filepath.Join(runDir, "vms", "sb-1"))
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	vmmExited := make(chan struct{})
	go func() { vmm.Wait(); close(vmmExited) }()
	t.Cleanup(func() { vmm.Process.Kill() })
	nsName := netNSPrefix(owner) + "sb-w"
	if os.Geteuid() == 0 {
		ns, err := netns.Create(context.Background(), nsName, netns.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Remove() })
	}

	alive, wd, err := startWatchdog([]string{self, rootRun, rootData, strconv.Itoa(owner)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wd.Process.Kill() })
	exited := make(chan error, 1)
	go func() { exited <- wd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the watchdog exited while its owner runs: %v", err)
	default:
	}
	alive.Close() // as the kernel does when the owner dies
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("watchdog: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the watchdog did not end after its owner did")
	}
	select {
	case <-vmmExited:
	case <-time.After(time.Minute):
		t.Fatal("the owner's VMM still runs")
	}
	for _, gone := range []string{runDir, dataDir} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s kept: %v", gone, err)
		}
	}
	if _, err := os.Stat(otherRun); err != nil {
		t.Errorf("another run's dir was removed: %v", err)
	}
	if names, _ := netns.List(netNSPrefix(owner)); len(names) != 0 {
		t.Errorf("namespaces kept: %v", names)
	}
}

func TestWatchdogNeedsOwner(t *testing.T) {
	if err := Watchdog(t.TempDir(), t.TempDir(), 0); err == nil {
		t.Fatal("a watchdog with no owner started")
	}
	if _, _, err := startWatchdog(nil); err == nil {
		t.Fatal("a watchdog with no command started")
	}
}
