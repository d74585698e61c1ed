package main

import (
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// TestQuotaText: the tenant table and `tenant quota` say each bound,
// max_builds included, and what no max_builds means (the fairness rule).
func TestQuotaText(t *testing.T) {
	for _, c := range []struct {
		t    apiv1.Tenant
		want string
	}{
		{apiv1.Tenant{}, "no quota"},
		{apiv1.Tenant{Quota: apiv1.Quota{MaxBuilds: 2}}, "max no bound sandboxes, max no bound, max 2 builds"},
		{apiv1.Tenant{Quota: apiv1.Quota{MaxSandboxes: 3, MaxMemoryMiB: 512}, QuotaDefault: true},
			"max 3 sandboxes, max 512 MiB, builds: the daemon's slots but one (the default quota)"},
	} {
		if got := quotaText(c.t); got != c.want {
			t.Errorf("quotaText(%+v) = %q, want %q", c.t.Quota, got, c.want)
		}
	}
}
