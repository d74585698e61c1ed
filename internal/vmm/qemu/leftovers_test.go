package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil"
	"github.com/forkd-dev/forkd/internal/vmm"
)

func TestVMMRunDir(t *testing.T) {
	cfg := vmm.MachineConfig{ID: "sb-1", RunDir: "/run/forkd/vms/sb,1", MemoryMiB: 128, Image: vmm.Image{Kernel: "/k"}}
	l := &launch{cfg: cfg, accel: vmm.AccelTCG, cpu: "max", runAs: "nobody", incoming: true}
	args := append([]string{"/usr/bin/qemu-system-x86_64"}, l.args()...)
	if dir, ok := vmmRunDir(args); !ok || dir != cfg.RunDir {
		t.Fatalf("driver's own command line: %q %v", dir, ok)
	}
	for name, a := range map[string][]string{
		"tail of a console log": {"tail", "-f", "/run/forkd/vms/sb-1/console.log"},
		"no -name":              {"qemu", "-qmp", "unix:/run/forkd/vms/sb-1/qmp.sock,server=on"},
		"another -name":         {"qemu", "-name", "mine", "-qmp", "unix:/run/forkd/vms/sb-1/qmp.sock,server=on"},
		"no -qmp":               {"qemu", "-name", "forkd-sb-1", "/run/forkd/vms/sb-1/"},
	} {
		if dir, ok := vmmRunDir(a); ok {
			t.Errorf("%s: taken for a VMM in %q", name, dir)
		}
	}
	// A comma in the path is doubled on the command line.
	if dir, ok := vmmRunDir([]string{"qemu", "-name", "forkd-x", "-qmp", "unix:/r/a,,b/qmp.sock,server=on,wait=off"}); !ok || dir != "/r/a,b" {
		t.Fatalf("escaped comma: %q %v", dir, ok)
	}
}

// A process that only names a path under the directory is not a VMM.
func TestVMMsUnderSkipsOtherProcesses(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "vms", "sb-1")
	os.MkdirAll(runDir, 0o755)
	other := exec.Command("sleep", "30", filepath.Join(runDir, "console.log"))
	// A stand-in with a VMM's arguments.
	vmmLike := testutil.FakeVMM(30, "-name", "forkd-sb-1", "-qmp", "unix:"+filepath.Join(runDir, qmpSocket)+",server=on,wait=off")
	for _, c := range []*exec.Cmd{other, vmmLike} {
		if err := c.Start(); err != nil {
			t.Skipf("start %v: %v", c.Args, err)
		}
		defer func(c *exec.Cmd) { c.Process.Kill(); c.Wait() }(c)
	}
	var found []vmm.LeftoverVMM
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if found = VMMsUnder(dir); len(found) > 0 {
			break
		}
	}
	pids := make([]int, 0, len(found))
	for _, f := range found {
		pids = append(pids, f.PID)
		if f.RunDir != runDir {
			t.Errorf("run dir %q, want %q", f.RunDir, runDir)
		}
	}
	if !slices.Equal(pids, []int{vmmLike.Process.Pid}) {
		t.Fatalf("found %v, want only the VMM-like process %d (not %d)", pids, vmmLike.Process.Pid, other.Process.Pid)
	}
}
