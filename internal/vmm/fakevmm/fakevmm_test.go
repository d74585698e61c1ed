package fakevmm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/vmm"
	"github.com/forkd-dev/forkd/internal/vmm/vmmtest"
)

// TestConformance runs the VMM conformance suite against the fake: every
// capability it offers is tested, on every host, in seconds.
func TestConformance(t *testing.T) {
	vmmtest.Run(t, func(t *testing.T) vmmtest.Target {
		return vmmtest.Target{
			Driver:    New(),
			Image:     testImage(t),
			MemoryMiB: 64,
			// A dying daemon's connection to the machine closes; a new
			// daemon makes a new driver.
			Restart: func(t *testing.T, m vmm.Machine) vmm.Driver {
				m.(*Machine).Detach()
				return New()
			},
		}
	})
}

// testImage is an image whose kernel is a small file: the fake checks
// that it exists and does not read it.
func testImage(t testing.TB) vmm.Image {
	t.Helper()
	k := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(k, []byte("not a kernel: the fake VMM never reads it\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return vmm.Image{Kernel: k}
}
