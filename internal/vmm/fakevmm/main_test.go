package fakevmm

import (
	"fmt"
	"os"
	"testing"
)

// TestMain fails the package when a test left a machine running: every
// machine must have ended by the end of its test (Kill in a cleanup, a
// snapshot with StopAfter, a failed restore).
func TestMain(m *testing.M) {
	code := m.Run()
	registry.Lock()
	for dir, v := range registry.vms {
		fmt.Fprintf(os.Stderr, "fakevmm: machine %s (%s) left running\n", v.cfg.ID, dir)
		code = 1
	}
	registry.Unlock()
	os.Exit(code)
}
