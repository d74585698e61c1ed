package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// release kills a VMM of the run that the engine left running before it
// removes the run dir, after which nothing could find it, and says so.
func TestReleaseKillsLeftVMMs(t *testing.T) {
	var said []string
	b := &runEnv{runDir: runDirOf(t.TempDir(), "spawn", os.Getpid()), dataDir: t.TempDir(),
		say: func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) }}
	os.MkdirAll(filepath.Join(b.runDir, "vms", "sb-1"), 0o755)
	// A VMM, and a process that only names a file of the run (a tail of
	// its console).
	vmm := fakeVMM(filepath.Join(b.runDir, "vms", "sb-1"))
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	bystander := exec.Command("sleep", "60", filepath.Join(b.runDir, "vms", "sb-1", "console.log"))
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bystander.Process.Kill(); bystander.Wait() })
	exited := make(chan struct{})
	go func() { vmm.Wait(); close(exited) }()
	t.Cleanup(func() { vmm.Process.Kill() })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b.alive, b.watchdog = w, exec.Command("true")
	if err := b.watchdog.Start(); err != nil {
		t.Fatal(err)
	}
	b.release()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the run's VMM still runs after release")
	}
	if _, err := os.Stat(b.runDir); !os.IsNotExist(err) {
		t.Fatalf("run dir kept: %v", err)
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a process that only names a file of the run was killed: %v", err)
	}
	if !strings.Contains(strings.Join(said, "\n"), "killed 1 VMM(s) of this run") {
		t.Errorf("reported %q", said)
	}
}
