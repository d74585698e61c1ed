package qemu

import (
	"testing"

	"github.com/forkd-dev/forkd/internal/testutil"
	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
	"github.com/forkd-dev/forkd/internal/vmm/vmmtest"
)

// TestConformance runs the VMM conformance suite against real QEMU
// microVMs (TCG here), jailed as the daemon runs them.
func TestConformance(t *testing.T) {
	vmmtest.Run(t, func(t *testing.T) vmmtest.Target {
		testutil.RequiresRoot(t)
		testutil.RequiresBinary(t, DefaultBinary)
		k := testguest.Kernel(t)
		return vmmtest.Target{
			Driver:    newTestDriver(t, Config{RunAs: DefaultRunAs}),
			Image:     vmm.Image{Kernel: k.Vmlinuz, Initrd: testguest.Initramfs(t, k)},
			MemoryMiB: testMemMiB,
			// A dying daemon's connections close: QMP here (the suite
			// closes the agent's).
			Restart: func(t *testing.T, m vmm.Machine) vmm.Driver {
				m.(*Machine).QMP().Close()
				return newTestDriver(t, Config{RunAs: DefaultRunAs})
			},
		}
	})
}
