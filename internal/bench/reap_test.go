package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/netns"
)

func TestReapStaleBenchRuns(t *testing.T) {
	runDir, dataDir := t.TempDir(), t.TempDir()
	dead, self := deadPID(t), os.Getpid()
	stale := runDirOf(runDir, "spawn", dead)
	oldStyle := filepath.Join(runDir, fmt.Sprintf("bench-%d", dead))
	live := runDirOf(runDir, "api", self)
	other := filepath.Join(runDir, "vms")
	for _, d := range []string{stale, oldStyle, live, other} {
		os.MkdirAll(filepath.Join(d, "vms", "sb-1"), 0o755)
	}
	// A VMM of the dead run.
	vmm := fakeVMM(filepath.Join(stale, "vms", "sb-1"))
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vmm.Wait() }()
	t.Cleanup(func() { vmm.Process.Kill() })
	staleData := dataDirOf(dataDir, "state", dead)
	staleWork := dataDirOf(dataDir, "image-from", dead)
	liveData := dataDirOf(dataDir, "api-audit", self)
	for _, d := range []string{staleData, staleWork, liveData} {
		os.MkdirAll(d, 0o700)
	}

	var said []string
	reapStale(runDir, dataDir, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })

	for _, gone := range []string{stale, oldStyle, staleData, staleWork} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s of a dead run kept (%v)", gone, err)
		}
	}
	for _, kept := range []string{live, other, liveData} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}
	select {
	case err := <-exited:
		if ws, ok := vmm.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("the dead run's VMM ended with %v, want SIGKILL", err)
		}
	case <-time.After(time.Minute):
		t.Error("the dead run's VMM still runs")
	}
	if !strings.Contains(strings.Join(said, "\n"), "killed its 1 VMM(s)") {
		t.Errorf("reported %q", said)
	}
}

func TestReapStaleBenchNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	dead := deadPID(t)
	staleName := netNSPrefix(dead) + "sb-test"
	liveName := netNSPrefix(os.Getpid()) + "sb-test"
	for _, n := range []string{staleName, liveName} {
		ns, err := netns.Create(context.Background(), n, netns.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Remove() })
	}
	reapStale(t.TempDir(), t.TempDir(), func(string, ...any) {})
	names, _ := netns.List("fkb")
	if strings.Contains(strings.Join(names, " "), staleName) || !strings.Contains(strings.Join(names, " "), liveName) {
		t.Fatalf("after reaping: %v (want %s gone, %s kept)", names, staleName, liveName)
	}
}
