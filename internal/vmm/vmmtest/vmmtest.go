// Package vmmtest is the conformance suite every VMM driver must pass
// (modelled on containerd's snapshotter test suite): a driver's test calls
// Run with a factory, and Run boots, snapshots, restores copy-on-write
// children, pauses, branches, adopts and kills real machines of that
// driver, and checks its error paths. Optional capabilities
// (vmm.FeatureReporter, vmm.Pauser, vmm.Adopter) decide which subtests
// run; the others are skipped saying which capability is missing.
//
// The guest is testguest's (internal/testutil/testguest): an image whose
// agent port speaks its line protocol (ping, set, get). The memory a test
// checks is the value "set" stores in the guest, which lives in guest
// RAM, so "a child sees its template's value, and two children diverge"
// is a statement about the driver's memory handling, not the agent's.
package vmmtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/vmm"
)

// Bounds on waits for guests under TCG on a busy machine. They only stop
// a hang, so they are generous.
const (
	vmTimeout   = 5 * time.Minute // a boot, restore or snapshot
	callTimeout = 2 * time.Minute // one reply from the guest
)

// Target is one driver under test and what it boots.
type Target struct {
	// Driver is the driver under test.
	Driver vmm.Driver
	// Image boots testguest's guest (AgentInit as /init): its agent
	// port, DialAgent's stream, speaks the line protocol. A driver
	// without a real guest (internal/vmm/fakevmm) answers the protocol
	// itself and needs only a kernel file that exists.
	Image vmm.Image
	// MemoryMiB is each machine's memory (default 256).
	MemoryMiB int
	// Restart simulates a daemon restart for the adopt test, for
	// drivers that are vmm.Adopters: it lets go of m as a dying daemon
	// does (its connections to the VMM closed, the process left running)
	// and returns the driver a new daemon would make. Nil skips that
	// test.
	Restart func(t *testing.T, m vmm.Machine) vmm.Driver
}

// Factory returns the target the suite runs against; it skips or fails
// t when the host cannot run the driver (testutil.Unavailable).
type Factory func(t *testing.T) Target

// Run runs the conformance suite against the driver factory makes. The
// subtests share one template (booted, set and snapshotted once).
func Run(t *testing.T, factory Factory) {
	tg := factory(t)
	if tg.MemoryMiB == 0 {
		tg.MemoryMiB = 256
	}
	dir, err := os.MkdirTemp("", "vmmtest") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &suite{Target: tg, dir: dir}
	t.Run("Boot", s.testBoot)
	t.Run("RestoreCopyOnWrite", s.testRestoreCopyOnWrite)
	t.Run("PauseResume", s.testPauseResume)
	t.Run("DiffSnapshot", s.testDiffSnapshot)
	t.Run("Adopt", s.testAdopt)
	t.Run("Kill", s.testKill)
	t.Run("RestoreMissingSnapshot", s.testRestoreMissing)
	t.Run("RestoreCorruptSnapshot", s.testRestoreCorrupt)
	t.Run("BootBadKernel", s.testBootBadKernel)
}

// features is the driver's vmm.Features (none without a FeatureReporter).
func (s *suite) features() vmm.Features {
	if fr, ok := s.Driver.(vmm.FeatureReporter); ok {
		return fr.Features()
	}
	return vmm.Features{}
}

// ctx is a context bounded by vmTimeout, cancelled at the end of t.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), vmTimeout)
	t.Cleanup(cancel)
	return c
}
