package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
)

// TestAdminActsForTenant: an admin token sending Forkd-Tenant acts as a
// user of that tenant (what the Kubernetes controller and gateway do for
// a namespace): it sees and forks that tenant's snapshots and its own
// tenant's (an operator's base images), not another tenant's; it sees
// only that tenant's sandboxes; it is held to that tenant's quota and a
// user's role; the audit log names the token and the tenant. Anyone else
// sending the header is refused.
func TestAdminActsForTenant(t *testing.T) {
	tk := newTenancy(t, nil)
	acme := map[string]string{auth.ActForHeader: "acme"}
	if a := tk.call("ops", "PUT", "/v1/tenants/acme/quota", `{"max_sandboxes":0,"max_memory_mib":32}`, nil); a.status != 200 {
		t.Fatalf("quota: %d %s", a.status, a.body)
	}

	var list apiv1.List[apiv1.Snapshot]
	if a := tk.call("ops", "GET", "/v1/snapshots", "", acme); a.status != 200 || json.Unmarshal(a.body, &list) != nil {
		t.Fatalf("acting for acme, list snapshots: %d %s", a.status, a.body)
	}
	var tags []string
	for _, s := range list.Items {
		tags = append(tags, s.Tag)
	}
	if strings.Join(tags, ",") != "a-base,legacy" {
		t.Errorf("acting for acme, the snapshots listed: %v, want a-base (acme's) and legacy (the admin's tenant's)", tags)
	}
	for id, want := range map[string]int{sbA: 200, sbB: 404, sbOld: 404} {
		if a := tk.call("ops", "GET", "/v1/sandboxes/"+id, "", acme); a.status != want {
			t.Errorf("acting for acme, GET sandbox %s: %d, want %d", id, a.status, want)
		}
	}
	for tag, want := range map[string]int{"a-base": 429, "legacy": 429, "b-base": 404} {
		a := tk.call("ops", "POST", "/v1/sandboxes", `{"tag":"`+tag+`","count":1}`, acme)
		if a.status != want || (want == 429 && !strings.Contains(a.p.Detail, `tenant "acme" quota`)) {
			t.Errorf("acting for acme, fork %s: %d %s, want %d (429: acme's quota, past authorization)", tag, a.status, a.body, want)
		}
	}
	// Seen is not owned, and a user is no admin.
	if a := tk.call("ops", "DELETE", "/v1/snapshots/legacy", "", acme); a.status != 403 {
		t.Errorf("acting for acme, remove the admin tenant's snapshot: %d %s", a.status, a.body)
	}
	if a := tk.call("ops", "GET", "/v1/system/df", "", acme); a.status != 403 ||
		!strings.Contains(a.p.Detail, `acting as a user of tenant "acme"`) {
		t.Errorf("acting for acme, an admin route: %d %s", a.status, a.body)
	}

	if a := tk.call("alice", "GET", "/v1/snapshots", "", map[string]string{auth.ActForHeader: "beta"}); a.status != 403 ||
		!strings.Contains(a.p.Detail, "only an admin token") {
		t.Errorf("a user sending %s: %d %s", auth.ActForHeader, a.status, a.body)
	}
	if a := tk.call("ops", "GET", "/v1/snapshots", "", map[string]string{auth.ActForHeader: "a b"}); a.status != 400 {
		t.Errorf("acting for a bad tenant name: %d %s", a.status, a.body)
	}

	found := false
	for _, rec := range auditRecords(t, tk.auditDir)["POST /v1/sandboxes"] {
		found = found || (rec.Token == "ops" && rec.Tenant == "acme")
	}
	if !found {
		t.Error("no audit record of ops' fork acting for acme")
	}
}
