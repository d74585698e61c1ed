package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestTenantQuota: a tenant's forks past its quota are refused with the
// quota, its value and the use; other tenants and forks without a quota
// are not held to it; killed sandboxes give their share back; children
// carry their tenant. The fake snapshot has 64 MiB.
func TestTenantQuota(t *testing.T) {
	ctx := context.Background()
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	acme := TenantQuota{MaxSandboxes: 2, MaxMemoryMiB: 3 * 64}
	fork := func(tenant string, q TenantQuota, n int) ([]*Sandbox, error) {
		return e.ForkWith(ctx, ForkOptions{Tag: "base", Count: n, Tenant: tenant, Quota: q})
	}
	sbs, err := fork("acme", acme, 2)
	if err != nil {
		t.Fatal(err)
	}
	if sbs[0].Tenant != "acme" || sbs[0].Info().Tenant != "acme" || e.record(sbs[0]).Tenant != "acme" {
		t.Errorf("child's tenant: %q / %q / %q", sbs[0].Tenant, sbs[0].Info().Tenant, e.record(sbs[0]).Tenant)
	}
	if u := e.TenantUsage("acme"); u != (TenantUsage{Sandboxes: 2, MemoryMiB: 128}) {
		t.Errorf("usage %+v", u)
	}
	_, err = fork("acme", acme, 1)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), `tenant "acme" quota max_sandboxes=2: 2 sandboxes in use`) {
		t.Fatalf("fork past max_sandboxes: %v", err)
	}
	// Another tenant, and a fork without a quota (an admin's), pass.
	if _, err := fork("beta", acme, 2); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if _, err := fork("acme", TenantQuota{}, 1); err != nil {
		t.Fatalf("no quota: %v", err)
	}
	// Memory: 3 running x 64 MiB = 192, the bound.
	_, err = fork("acme", TenantQuota{MaxMemoryMiB: 3 * 64}, 1)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), `quota max_memory_mib=192: 192 MiB of guest memory in use, 64 more`) {
		t.Fatalf("fork past max_memory_mib: %v", err)
	}
	if _, err := e.Kill(ctx, []string{sbs[0].ID, sbs[1].ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := fork("acme", acme, 1); err != nil {
		t.Fatalf("fork into killed sandboxes' share: %v", err)
	}
	if len(e.tenantStarting) != 0 {
		t.Errorf("reservations left: %+v", e.tenantStarting)
	}
}
