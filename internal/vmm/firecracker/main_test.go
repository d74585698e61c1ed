package firecracker

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/vmm"
	"github.com/forkd-dev/forkd/internal/vmm/firecracker/fctest"
)

// envAsFirecracker makes the test binary run as the fake firecracker
// (fctest.Main): the driver starts it as it would start Firecracker.
const envAsFirecracker = "FORKD_TEST_AS_FIRECRACKER"

func TestMain(m *testing.M) {
	if os.Getenv(envAsFirecracker) == "1" {
		os.Exit(fctest.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// fakeEnv points the driver at this test binary as a fake firecracker
// and returns the file its calls are logged to. faults are
// fctest.EnvFaults entries.
func fakeEnv(t *testing.T, faults ...string) (bin, callLog string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	callLog = filepath.Join(t.TempDir(), "calls.jsonl")
	t.Setenv(envAsFirecracker, "1")
	t.Setenv(fctest.EnvCallLog, callLog)
	t.Setenv(fctest.EnvFaults, strings.Join(faults, ";"))
	return self, callLog
}

// newTestDriver is an unjailed driver running the fake.
func newTestDriver(t *testing.T, cfg Config, faults ...string) (*Driver, string) {
	t.Helper()
	bin, log := fakeEnv(t, faults...)
	cfg.Binary, cfg.NoJailer = bin, true
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, log
}

// calls reads the fake's call log; it fails the test on any contract
// violation in it.
func calls(t *testing.T, path string) []fctest.Call {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []fctest.Call
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var c fctest.Call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(c.Fault, "fctest contract violation") {
			t.Errorf("contract violation: %s", c.Fault)
		}
		out = append(out, c)
	}
	return out
}

// sequence is the calls as "PUT /path 204" lines.
func sequence(cs []fctest.Call) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.String()
	}
	return out
}

// body finds the last call to method and path and decodes its body.
func body(t *testing.T, cs []fctest.Call, method, path string) map[string]any {
	t.Helper()
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i].Method == method && cs[i].Path == path {
			var m map[string]any
			if err := json.Unmarshal(cs[i].Body, &m); err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("no call %s %s", method, path)
	return nil
}

// testImage writes placeholder image files (the fake opens, never boots
// them); the kernel starts like an ELF file, so the driver passes it as
// the vmlinux it is.
func testImage(t *testing.T) vmm.Image {
	t.Helper()
	dir := t.TempDir()
	img := vmm.Image{Kernel: filepath.Join(dir, "vmlinux"), Initrd: filepath.Join(dir, "initrd"), Rootfs: filepath.Join(dir, "rootfs.ext4"), KernelArgs: []string{"quiet"}}
	for _, p := range []string{img.Kernel, img.Initrd, img.Rootfs} {
		if err := os.WriteFile(p, []byte("\x7fELF placeholder"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func testConfig(t *testing.T, id string, img vmm.Image) vmm.MachineConfig {
	return vmm.MachineConfig{ID: id, RunDir: filepath.Join(t.TempDir(), id), Image: img, MemoryMiB: 256, VCPUs: 2}
}

// fullTemplate boots a template machine of img, takes its full snapshot
// (the fake's sparse memory file) and waits until it stopped.
func fullTemplate(t *testing.T, d *Driver, img vmm.Image) vmm.SnapshotResult {
	t.Helper()
	m := boot(t, d, testConfig(t, "tmpl", img))
	dir := t.TempDir()
	full, err := m.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: filepath.Join(dir, "state"), MemoryFile: filepath.Join(dir, "mem"), StopAfter: true})
	if err != nil {
		t.Fatal(err)
	}
	<-m.Done()
	return full
}

// writeAt writes b at off into the existing file path.
func writeAt(path string, b []byte, off int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
