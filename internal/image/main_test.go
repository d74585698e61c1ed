package image

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// The tests build real images from the host's apt sources. Downloads are
// shared by every test of one run: the kernel and the busybox .deb are
// fetched once into sharedDir, and each test's DataDir links to them.
var sharedDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "forkd-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedDir = dir
	code := m.Run()
	removeTree(dir)
	os.Exit(code)
}

var (
	kernelOnce sync.Once
	kernelErr  error
	agentOnce  sync.Once
	agentPath  string
	agentErr   error
)

// sharedKernel fetches the kernel once per test run. Hosts without apt
// (not Debian, no package lists) skip the tests that need it.
func sharedKernel(t *testing.T) *Kernel {
	t.Helper()
	kernelOnce.Do(func() {
		start := time.Now()
		_, kernelErr = FetchKernel(context.Background(), filepath.Join(sharedDir, "cache"), func(s string) { t.Log(s) })
		t.Logf("cold FetchKernel: %v", time.Since(start))
	})
	if kernelErr != nil {
		if errdefs.IsFailedPrecondition(kernelErr) {
			t.Skipf("no guest kernel on this host: %v", kernelErr)
		}
		t.Fatalf("FetchKernel: %v", kernelErr)
	}
	k, err := FetchKernel(context.Background(), filepath.Join(sharedDir, "cache"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testAgent builds testdata/testinit, a small static /init that stands in
// for forkd-agent.
func testAgent(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		agentPath = filepath.Join(sharedDir, "testinit")
		cmd := exec.Command("go", "build", "-o", agentPath, "./testdata/testinit")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("go build testinit: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentPath
}

// newDataDir returns an empty data directory whose kernel and .deb caches
// are the run's shared ones.
func newDataDir(t *testing.T) string {
	t.Helper()
	sharedKernel(t)
	dd := t.TempDir()
	cache := filepath.Join(dd, "cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"kernel", "debs"} {
		if err := os.MkdirAll(filepath.Join(sharedDir, "cache", sub), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(sharedDir, "cache", sub), filepath.Join(cache, sub)); err != nil {
			t.Fatal(err)
		}
	}
	return dd
}

func newBuilder(t *testing.T, dataDir string) *Builder {
	return &Builder{
		DataDir:     dataDir,
		AgentBinary: testAgent(t),
		Progress:    func(s string) { t.Log(s) },
	}
}

// mustRecipe parses recipe text.
func mustRecipe(t *testing.T, text string) *recipe.Recipe {
	t.Helper()
	r, err := recipe.Parse("test.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const minimalRecipe = `name = "minimal"
base = "busybox"
memory_mib = 256
`

func requireBinary(t *testing.T, name string) string {
	t.Helper()
	p, err := lookTool(name)
	if err != nil {
		p, err = exec.LookPath(name)
	}
	if err != nil {
		t.Skipf("%s not installed", name)
	}
	return p
}

// hostKHz is the TSC frequency hint the guest needs under TCG.
func hostKHz(t *testing.T) int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		t.Skip("no /proc/cpuinfo")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(mhz * 1000)
			}
		}
	}
	t.Skip("no cpu MHz in /proc/cpuinfo")
	return 0
}

// bootImage boots img under QEMU (TCG, as on hosts without KVM) and returns
// the console output once the test init has powered the VM off.
func bootImage(t *testing.T, img *Image) string {
	t.Helper()
	qemu := requireBinary(t, "qemu-system-x86_64")
	if testing.Short() {
		t.Skip("boot test skipped in -short mode")
	}
	args := []string{
		"-M", "microvm,x-option-roms=on,isa-serial=on,rtc=on", "-accel", "tcg", "-cpu", "max",
		"-smp", "1", "-m", fmt.Sprintf("%dM", img.MemoryMiB),
		"-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-no-reboot",
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		// reboot=t as the QEMU driver has it: the kernel's default reboot
		// methods can leave a microvm guest in a reboot loop QEMU never
		// sees (see kernelArgs in internal/vmm/qemu), and then this boot
		// never ends.
		"-append", fmt.Sprintf("console=ttyS0 panic=-1 reboot=t quiet tsc_early_khz=%d tsc=reliable no_timer_check", hostKHz(t)),
		"-serial", "stdio",
		"-drive", "file=" + img.Rootfs + ",format=raw,if=none,id=d0,readonly=on",
		"-device", "virtio-blk-device,drive=d0",
	}
	// A boot takes seconds; the limit is generous for a loaded machine,
	// yet leaves time for the retry below within the package's timeout.
	const limit = 2 * time.Minute
	var out []byte
	for attempt := 1; attempt <= 2; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		start := time.Now()
		var err error
		out, err = exec.CommandContext(ctx, qemu, args...).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if !timedOut {
			if err != nil {
				t.Fatalf("qemu: %v\n%s", err, out)
			}
			t.Logf("boot to power-off: %v", time.Since(start).Round(time.Millisecond))
			return string(out)
		}
		// A TCG guest very rarely hangs in early boot on a loaded host; one
		// retry keeps that from failing the image tests.
		t.Logf("boot attempt %d timed out; console:\n%s", attempt, out)
	}
	t.Fatalf("guest did not power off in %v, twice", limit)
	return ""
}
