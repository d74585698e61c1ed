package api

import (
	"encoding/json"
	"net/http"
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
// sending the header is refused (and audited under its token), as is an
// admin acting for its own tenant, or two headers.
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
	// Acting for its own tenant would own the operator's snapshots.
	if a := tk.call("ops", "DELETE", "/v1/snapshots/legacy", "", map[string]string{auth.ActForHeader: "default"}); a.status != 400 ||
		!strings.Contains(a.p.Detail, "own tenant") {
		t.Errorf("acting for the admin's own tenant: %d %s", a.status, a.body)
	}
	if _, err := tk.s.Engine.Store().Get("legacy"); err != nil {
		t.Fatalf("legacy is gone: %v", err)
	}
	// Two values are refused, not collapsed (nor passed on).
	req, _ := http.NewRequest("GET", tk.srv.URL+"/v1/snapshots", nil)
	req.Header.Set("Authorization", "Bearer "+tk.tok["ops"])
	req.Header.Add(auth.ActForHeader, "")
	req.Header.Add(auth.ActForHeader, "acme")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 400 {
		t.Errorf("two %s headers: %v %v", auth.ActForHeader, resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	// A user's attempt is audited as its own refused request.
	if a := tk.call("alice", "POST", "/v1/sandboxes", `{"tag":"b-base"}`, map[string]string{auth.ActForHeader: "beta"}); a.status != 403 {
		t.Errorf("alice forking as beta: %d %s", a.status, a.body)
	}
	refused := false
	for _, rec := range auditRecords(t, tk.auditDir)["POST /v1/sandboxes"] {
		refused = refused || (rec.Token == "alice" && rec.Tenant == "acme" && rec.Outcome == "permission_denied")
	}
	if !refused {
		t.Error("alice's refused attempt to act for beta is not in the audit log under her token")
	}

	found := false
	for _, rec := range auditRecords(t, tk.auditDir)["POST /v1/sandboxes"] {
		found = found || (rec.Token == "ops" && rec.Tenant == "acme")
	}
	if !found {
		t.Error("no audit record of ops' fork acting for acme")
	}
}

// headers adds fixed headers to every request.
type headers struct {
	h    map[string]string
	next http.RoundTripper
}

func (t headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header.Set(k, v)
	}
	return t.next.RoundTrip(r)
}

// TestAdminActsForTenantThroughMCP: the REST calls an /mcp tool makes for
// an admin acting for a tenant act for it too, so MCP is no way around
// the tenant's bounds.
func TestAdminActsForTenantThroughMCP(t *testing.T) {
	tk := newTenancy(t, nil)
	hc := &http.Client{Transport: headers{map[string]string{
		"Authorization": "Bearer " + tk.tok["ops"], auth.ActForHeader: "acme",
	}, http.DefaultTransport}}
	cs, err := mcpConnect(t, tk.srv.URL+"/mcp", hc)
	if err != nil {
		t.Fatal(err)
	}
	got := resultText(toolCall(t, cs, "list_snapshots", map[string]any{}))
	if !strings.Contains(got, "a-base") || !strings.Contains(got, "legacy") || strings.Contains(got, "b-base") {
		t.Errorf("list_snapshots acting for acme: %s; want a-base and legacy, not b-base", got)
	}
}
