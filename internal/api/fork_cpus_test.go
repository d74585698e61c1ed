package api

import (
	"strings"
	"testing"
)

// TestForkCPUsOutOfRange: a fork's cpus outside 0.1..vCPUs is 400 naming
// the range, before any VMM would start.
func TestForkCPUsOutOfRange(t *testing.T) {
	tk := newTenancy(t, nil)
	for _, cpus := range []string{"-1", "0.05", "2", "1e9"} {
		a := tk.call("ops", "POST", "/v1/sandboxes", `{"tag":"a-base","count":1,"cpus":`+cpus+`}`, nil)
		if a.status != 400 || !strings.Contains(a.p.Detail, "cpus") {
			t.Errorf("cpus %s: %d %s, want 400 naming cpus", cpus, a.status, a.body)
		}
	}
}
