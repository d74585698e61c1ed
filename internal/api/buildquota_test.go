package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// TestTenantBuildQuotas: POST /v1/snapshots by a tenant at its
// max_builds is 429 (with Retry-After) naming the tenant, the quota, its
// builds and the fix, while another tenant's is accepted; a tenant
// without max_builds is held to all the daemon's slots but one; an admin
// to the daemon's slots only; max_builds out of range is 400 naming the
// bound. Accepted creations fail in the image build (the test engine has
// no agent binary), so no VMM ever starts.
func TestTenantBuildQuotas(t *testing.T) {
	tk := newTenancy(t, func(c *sandbox.Config) { c.MaxConcurrentBuilds = 3 })
	e := tk.s.Engine
	put := func(tenant, body string) answer {
		return tk.call("ops", "PUT", "/v1/tenants/"+tenant+"/quota", body, nil)
	}
	create := func(who, tag string) answer {
		return tk.call(who, "POST", "/v1/snapshots", `{"tag":"`+tag+`","recipe_toml":"name = 'tiny'\nbase = 'busybox'\n"}`, nil)
	}
	var ten apiv1.Tenant
	a := put("acme", `{"max_sandboxes":0,"max_memory_mib":0,"max_builds":1}`)
	if json.Unmarshal(a.body, &ten); a.status != 200 || ten.Quota.MaxBuilds != 1 || ten.QuotaDefault {
		t.Fatalf("PUT quota: %d %s", a.status, a.body)
	}

	// acme holds its one build (as a running creation would).
	held, err := e.TryAcquireBuild("create snapshot held", "acme", sandbox.TenantQuota{MaxBuilds: 1})
	if err != nil {
		t.Fatal(err)
	}
	a = create("alice", "a1")
	if a.status != 429 || a.p.Code != "resource_exhausted" || a.header.Get("Retry-After") == "" ||
		!strings.Contains(a.p.Detail, "create snapshot a1: tenant \"acme\" quota max_builds=1: 1 image builds or snapshot creations running; wait for them to finish, or ask an admin to raise the quota (`forkd tenant quota acme --max-builds N`)") {
		t.Errorf("acme past max_builds: %d %v %s", a.status, a.header, a.body)
	}
	tk.getJSON("alice", "/v1/tenants/acme", &ten)
	if ten.Usage.Builds != 1 || ten.Quota.MaxBuilds != 1 {
		t.Errorf("acme as alice sees it: %+v", ten)
	}

	// beta is not held to acme's builds: accepted (200, a stream whose
	// build then fails), and its slot is back when the stream ends.
	a = create("bob", "b1")
	if a.status != 200 || !strings.Contains(string(a.body), "AgentBinary is empty") {
		t.Errorf("beta's creation while acme is at its max_builds: %d %s", a.status, a.body)
	}
	if u := e.TenantUsage("beta"); u.Builds != 0 {
		t.Errorf("beta's builds after its creation ended: %+v", u)
	}

	// beta has no max_builds: it may hold 2 of the 3 slots. (The third
	// is acme's, so an admin now meets the daemon's limit.)
	for i := range 2 {
		s, err := e.TryAcquireBuild("create snapshot held", "beta", sandbox.TenantQuota{})
		if err != nil {
			t.Fatalf("beta's build %d: %v", i+1, err)
		}
		defer s.Release()
	}
	a = create("bob", "b2")
	if a.status != 429 || !strings.Contains(a.p.Detail, `tenant "beta" has no max_builds quota, so it may hold 2 of the daemon's 3 build slots`) {
		t.Errorf("beta past the fairness rule: %d %s", a.status, a.body)
	}
	a = create("ops", "o1")
	if a.status != 429 || strings.Contains(a.p.Detail, "tenant") || !strings.Contains(a.p.Detail, "--max-builds") {
		t.Errorf("admin with every slot taken: %d %s, want the daemon's limit", a.status, a.body)
	}
	// acme's slot back: the admin is held to no tenant's bound.
	held.Release()
	if a = create("ops", "o1"); a.status != 200 {
		t.Errorf("admin with a slot free: %d %s", a.status, a.body)
	}

	for body, says := range map[string]string{
		`{"max_sandboxes":0,"max_memory_mib":0,"max_builds":-1}`:   "quota max_builds -1 out of range: 0 (no limit of its own) to 1000",
		`{"max_sandboxes":0,"max_memory_mib":0,"max_builds":1001}`: "quota max_builds 1001 out of range",
	} {
		if a := put("acme", body); a.status != 400 || a.p.Code != "invalid_argument" || !strings.Contains(a.p.Detail, says) {
			t.Errorf("PUT quota %s: %d %s, want 400 saying %q", body, a.status, a.body, says)
		}
	}
}
