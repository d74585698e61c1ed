package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/testutil"
)

func snapshotOf(t *testing.T, a answer) apiv1.Snapshot {
	t.Helper()
	var s apiv1.Snapshot
	if a.status != http.StatusOK || json.Unmarshal(a.body, &s) != nil {
		t.Fatalf("want a snapshot: %d %s", a.status, a.body)
	}
	return s
}

// TestSharedSnapshotIsForkableNotRemovable: the owner shares a tag with
// another tenant, which then sees it (not with whom it is shared) and can
// fork it (here the fork reaches the quota check: it got past
// authorization), but not remove, export, compact, overwrite or re-share
// it; unsharing hides it again.
func TestSharedSnapshotIsForkableNotRemovable(t *testing.T) {
	tk := newTenancy(t, nil)
	// Forks of acme stop at its quota, before any VMM would start.
	if a := tk.call("ops", "PUT", "/v1/tenants/acme/quota", `{"max_sandboxes":0,"max_memory_mib":32}`, nil); a.status != 200 {
		t.Fatalf("quota: %d %s", a.status, a.body)
	}
	fork := func() answer { return tk.call("alice", "POST", "/v1/sandboxes", `{"tag":"b-base","count":1}`, nil) }
	if a := fork(); a.status != 404 {
		t.Fatalf("fork of an unshared snapshot of another tenant: %d %s", a.status, a.body)
	}

	got := snapshotOf(t, tk.call("bob", "PUT", "/v1/snapshots/b-base/shares/acme", "", nil))
	if got.Owner != "beta" || strings.Join(got.SharedWith, ",") != "acme" {
		t.Fatalf("after sharing: owner %q shared %v", got.Owner, got.SharedWith)
	}
	seen := snapshotOf(t, tk.call("alice", "GET", "/v1/snapshots/b-base", "", nil))
	if seen.Owner != "beta" || seen.SharedWith != nil || seen.ID != got.ID {
		t.Errorf("alice's view: owner %q shared %v", seen.Owner, seen.SharedWith)
	}
	list := listAs[apiv1.Snapshot](tk, "alice", "/v1/snapshots")
	if len(list) != 2 || list[0].Tag != "a-base" || list[1].Tag != "b-base" {
		t.Errorf("alice lists %+v", list)
	}
	if a := fork(); a.status != 429 || !strings.Contains(a.p.Detail, `tenant "acme" quota max_memory_mib=32`) {
		t.Errorf("fork of a shared snapshot: %d %s, want the quota's 429 (authorized)", a.status, a.body)
	}

	for _, c := range []routeCase{
		{method: "DELETE", path: "/v1/snapshots/b-base"},
		{method: "DELETE", path: "/v1/snapshots/b-base?cascade=true"},
		{method: "GET", path: "/v1/snapshots/b-base/archive"},
		{method: "POST", path: "/v1/snapshots/b-base/compact", body: `{"to":"mine"}`},
		{method: "PUT", path: "/v1/snapshots/b-base/shares/gamma"},
		{method: "DELETE", path: "/v1/snapshots/b-base/shares/acme"},
	} {
		if a := tk.call("alice", c.method, c.path, c.body, nil); a.status != 403 || a.p.Code != "permission_denied" ||
			!strings.Contains(a.p.Detail, `snapshot "b-base" belongs to tenant "beta"`) {
			t.Errorf("alice %s %s: %d %s, want 403", c.method, c.path, a.status, a.body)
		}
	}
	// Overwriting: tags are not replaced but by an admin's forced import.
	if a := tk.call("alice", "POST", "/v1/snapshots", `{"tag":"b-base","recipe_toml":"name = 'tiny'\nbase = 'busybox'\n"}`, nil); a.status != 409 {
		t.Errorf("alice creating over b-base: %d %s", a.status, a.body)
	}
	if _, err := tk.s.Engine.Store().Get("b-base"); err != nil {
		t.Fatalf("b-base is gone: %v", err)
	}

	// Share validation, then every tenant, then none.
	for path, says := range map[string]string{
		"/v1/snapshots/b-base/shares/a%20b": "tenant name",
		"/v1/snapshots/b-base/shares/beta":  "already belongs to tenant",
	} {
		if a := tk.call("bob", "PUT", path, "", nil); a.status != 400 || !strings.Contains(a.p.Detail, says) {
			t.Errorf("bob PUT %s: %d %s", path, a.status, a.body)
		}
	}
	if a := tk.call("viewer", "GET", "/v1/snapshots/b-base", "", nil); a.status != 200 {
		t.Errorf("viewer (acme) on a snapshot shared with acme: %d", a.status)
	}
	snapshotOf(t, tk.call("bob", "DELETE", "/v1/snapshots/b-base/shares/acme", "", nil))
	if a := tk.call("alice", "GET", "/v1/snapshots/b-base", "", nil); a.status != 404 {
		t.Errorf("after unsharing: %d %s", a.status, a.body)
	}
	all := snapshotOf(t, tk.call("bob", "PUT", "/v1/snapshots/b-base/shares/*", "", nil))
	if strings.Join(all.SharedWith, ",") != "*" {
		t.Errorf("shared with every tenant: %v", all.SharedWith)
	}
	if a := tk.call("alice", "GET", "/v1/snapshots/b-base", "", nil); a.status != 200 {
		t.Errorf("alice on a snapshot shared with every tenant: %d", a.status)
	}
}

// TestTenantQuotas: a fork past the tenant's quota is 429 naming the
// quota, its value and the use; the default quota holds tenants without
// their own; admins are held to none (only to the daemon's limits);
// quota values out of range are 400 naming the bound.
func TestTenantQuotas(t *testing.T) {
	tk := newTenancy(t, func(c *sandbox.Config) { c.MaxSandboxes = 1 })
	put := func(tenant, body string) answer {
		return tk.call("ops", "PUT", "/v1/tenants/"+tenant+"/quota", body, nil)
	}
	var ten apiv1.Tenant
	a := put("acme", `{"max_sandboxes":1,"max_memory_mib":0}`)
	if json.Unmarshal(a.body, &ten); a.status != 200 || ten.Name != "acme" || ten.Quota.MaxSandboxes != 1 || ten.QuotaDefault {
		t.Fatalf("PUT quota: %d %s", a.status, a.body)
	}
	a = tk.call("alice", "POST", "/v1/sandboxes", `{"tag":"a-base","count":2}`, nil)
	if a.status != 429 || a.p.Code != "resource_exhausted" || a.header.Get("Retry-After") == "" ||
		!strings.Contains(a.p.Detail, `tenant "acme" quota max_sandboxes=1: 0 sandboxes in use (running or starting), 2 more would pass it`) {
		t.Errorf("fork past max_sandboxes: %d %v %s", a.status, a.header, a.body)
	}
	put("acme", `{"max_sandboxes":0,"max_memory_mib":32}`)
	a = tk.call("alice", "POST", "/v1/sandboxes", `{"tag":"a-base","count":1}`, nil)
	if a.status != 429 || !strings.Contains(a.p.Detail, `tenant "acme" quota max_memory_mib=32: 0 MiB of guest memory in use, 64 more`) {
		t.Errorf("fork past max_memory_mib: %d %s", a.status, a.body)
	}

	// The default quota, for beta (and the default tenant).
	put("*", `{"max_sandboxes":1,"max_memory_mib":0}`)
	a = tk.call("bob", "POST", "/v1/sandboxes", `{"tag":"b-base","count":2}`, nil)
	if a.status != 429 || !strings.Contains(a.p.Detail, `tenant "beta" quota max_sandboxes=1`) {
		t.Errorf("fork past the default quota: %d %s", a.status, a.body)
	}
	tk.getJSON("bob", "/v1/tenants/beta", &ten)
	if !ten.QuotaDefault || ten.Quota.MaxSandboxes != 1 || ten.Usage != (apiv1.TenantUsage{}) {
		t.Errorf("beta as bob sees it: %+v", ten)
	}
	// An admin is held to the daemon's --max-sandboxes only.
	a = tk.call("ops", "POST", "/v1/sandboxes", `{"tag":"a-base","count":2}`, nil)
	if a.status != 429 || strings.Contains(a.p.Detail, "quota") || !strings.Contains(a.p.Detail, "--max-sandboxes") {
		t.Errorf("admin fork: %d %s, want the daemon's limit, not a tenant quota", a.status, a.body)
	}

	for body, says := range map[string]string{
		`{"max_sandboxes":-1,"max_memory_mib":0}`:            "quota max_sandboxes -1 out of range: 0 (no limit) to 100000",
		`{"max_sandboxes":100001,"max_memory_mib":0}`:        "quota max_sandboxes 100001 out of range",
		`{"max_sandboxes":0,"max_memory_mib":2199023255552}`: "quota max_memory_mib 2199023255552 out of range: 0 (no limit) to 1073741824",
		`{"max_sandboxes":0,"max_memory":1}`:                 `unknown field "max_memory"`,
	} {
		if a := put("acme", body); a.status != 400 || a.p.Code != "invalid_argument" || !strings.Contains(a.p.Detail, says) {
			t.Errorf("PUT quota %s: %d %s, want 400 saying %q", body, a.status, a.body, says)
		}
	}
	if a := put("a%20b", `{"max_sandboxes":1,"max_memory_mib":0}`); a.status != 400 {
		t.Errorf("bad tenant name: %d %s", a.status, a.body)
	}

	// Tenants: a non-admin sees its own only.
	list := listAs[apiv1.Tenant](tk, "alice", "/v1/tenants")
	if len(list) != 1 || list[0].Name != "acme" || list[0].Quota.MaxMemoryMiB != 32 {
		t.Errorf("alice's tenants: %+v", list)
	}
	list = listAs[apiv1.Tenant](tk, "ops", "/v1/tenants")
	if len(list) != 3 || list[0].Name != "default" || list[1].Name != "acme" || list[2].Name != "beta" {
		t.Errorf("admin's tenants: %+v", list)
	}
	if a := tk.call("alice", "GET", "/v1/tenants/beta", "", nil); a.status != 404 {
		t.Errorf("alice on beta: %d %s", a.status, a.body)
	}
}

// TestAuditRecordsNameTenantAndToken: every mutating request's record
// names its token and tenant, refusals included, and the log verifies.
func TestAuditRecordsNameTenantAndToken(t *testing.T) {
	tk := newTenancy(t, nil)
	tk.call("alice", "DELETE", "/v1/sandboxes/"+sbB, "", nil)
	tk.call("viewer", "DELETE", "/v1/sandboxes/"+sbA, "", nil)
	tk.call("bob", "PUT", "/v1/snapshots/b-base/shares/acme", "", nil)
	tk.call("ops", "PUT", "/v1/tenants/acme/quota", `{"max_sandboxes":3,"max_memory_mib":0}`, nil)
	want := map[string]struct{ tenant, action, outcome string }{
		"alice":  {"acme", "DELETE /v1/sandboxes/{id}", "not_found"},
		"viewer": {"acme", "DELETE /v1/sandboxes/{id}", "permission_denied"},
		"bob":    {"beta", "PUT /v1/snapshots/{tag}/shares/{tenant}", "ok"},
		"ops":    {"default", "PUT /v1/tenants/{tenant}/quota", "ok"},
	}
	var recs []audit.Record
	testutil.WaitFor(t, "the audit records of the four calls", func() bool {
		var err error
		if recs, err = audit.Tail(tk.auditDir, 100); err != nil {
			t.Fatal(err)
		}
		return len(recs) >= len(want)
	})
	seen := map[string]bool{}
	for _, r := range recs {
		w, ok := want[r.Token]
		if !ok {
			t.Errorf("record of an unexpected token: %+v", r)
			continue
		}
		seen[r.Token] = true
		if r.Tenant != w.tenant || r.Action != w.action || r.Outcome != w.outcome {
			t.Errorf("%s's record: tenant %q action %q outcome %q, want %+v", r.Token, r.Tenant, r.Action, r.Outcome, w)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("records of %v, want one per token of %v", seen, want)
	}
	if rep, err := audit.Verify(tk.auditDir); err != nil || !rep.OK {
		t.Errorf("verify: %+v %v", rep, err)
	}
}

// TestOwnershipSurvivesRestart: tags a tenant imported, and shares, are
// still its own and shared after a restart (a new Server over the same
// state file); sandboxes keep their tenant (the fixture's come from
// records); an import does not replace another tenant's tag.
func TestOwnershipSurvivesRestart(t *testing.T) {
	tk := newTenancy(t, nil)
	exp := tk.call("ops", "GET", "/v1/snapshots/legacy/archive", "", nil)
	if exp.status != 200 {
		t.Fatalf("export: %d %s", exp.status, exp.body)
	}
	imp := func(who, query string) answer {
		return tk.call(who, "POST", "/v1/snapshots/import"+query, string(exp.body), map[string]string{"Content-Type": "application/octet-stream"})
	}
	if a := imp("alice", "?tag=mine"); a.status != 201 || !strings.Contains(string(a.body), `"owner":"acme"`) {
		t.Fatalf("alice's import: %d %s", a.status, a.body)
	}
	if a := imp("alice", "?tag=b-base"); a.status != 409 {
		t.Errorf("alice importing onto beta's tag: %d %s", a.status, a.body)
	}
	tk.call("bob", "PUT", "/v1/snapshots/b-base/shares/acme", "", nil)

	s2 := &Server{Engine: tk.s.Engine, Version: "test", Tokens: tk.s.Tokens}
	if err := s2.LoadState(tk.st); err != nil {
		t.Fatal(err)
	}
	srv2 := httptest.NewServer(s2.Handler())
	defer srv2.Close()
	tk.srv = srv2
	list := listAs[apiv1.Snapshot](tk, "alice", "/v1/snapshots")
	var got []string
	for _, s := range list {
		got = append(got, s.Tag+"@"+s.Owner)
	}
	if strings.Join(got, " ") != "a-base@acme b-base@beta mine@acme" {
		t.Errorf("alice lists after a restart: %v", got)
	}
	if a := tk.call("bob", "DELETE", "/v1/snapshots/mine", "", nil); a.status != 404 {
		t.Errorf("bob removing alice's import: %d %s", a.status, a.body)
	}
	if a := tk.call("alice", "DELETE", "/v1/snapshots/mine", "", nil); a.status != 200 {
		t.Errorf("alice removing her import: %d %s", a.status, a.body)
	}
	recs, _ := tk.st.SnapshotOwners()
	for _, r := range recs {
		if r.Tag == "mine" {
			t.Errorf("the record of a removed tag stays: %+v", r)
		}
	}
}

// TestLegacyTokenStoreIsAdmin: a token store written before roles loads
// with its tokens as admins: an upgrade locks nobody out.
func TestLegacyTokenStoreIsAdmin(t *testing.T) {
	tk := newTenancy(t, nil)
	const plain = "forkd_an-old-token-from-before-roles"
	body := `{"version":1,"tokens":[{"name":"old","sha256":"` + hexSHA256(plain) + `","created":"2024-01-01T00:00:00Z"}]}`
	if err := os.WriteFile(tk.s.Tokens.Path(), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	tk.tok["old"] = plain
	sbs := listAs[apiv1.Sandbox](tk, "old", "/v1/sandboxes")
	if len(sbs) != 3 {
		t.Errorf("the legacy token lists %d sandboxes, want all 3", len(sbs))
	}
	if a := tk.call("old", "GET", "/v1/images", "", nil); a.status != 200 {
		t.Errorf("the legacy token on an admin route: %d %s", a.status, a.body)
	}
	if a := tk.call("alice", "GET", "/v1/sandboxes", "", nil); a.status != 401 {
		t.Errorf("a token the rewritten store no longer has: %d", a.status)
	}
}

// TestMCPToolCallsAreScoped: MCP tool calls are REST calls of the same
// principal, so they see and touch what its token may, nothing more.
func TestMCPToolCallsAreScoped(t *testing.T) {
	tk := newTenancy(t, nil)
	connect := func(who string) func(tool string, args map[string]any) (bool, string) {
		cs, err := mcpConnect(t, tk.srv.URL+"/mcp", &http.Client{Transport: bearer{tk.tok[who], http.DefaultTransport}})
		if err != nil {
			t.Fatalf("%s: connect: %v", who, err)
		}
		return func(tool string, args map[string]any) (bool, string) {
			res := toolCall(t, cs, tool, args)
			return res.IsError, resultText(res)
		}
	}
	alice := connect("alice")
	if isErr, text := alice("list_sandboxes", map[string]any{}); isErr || !strings.Contains(text, sbA) || strings.Contains(text, sbB) || strings.Contains(text, sbOld) {
		t.Errorf("alice's list_sandboxes: %v %s", isErr, text)
	}
	if isErr, text := alice("list_snapshots", map[string]any{}); isErr || !strings.Contains(text, "a-base") || strings.Contains(text, "b-base") {
		t.Errorf("alice's list_snapshots: %v %s", isErr, text)
	}
	if isErr, text := alice("kill_sandbox", map[string]any{"sandbox_id": sbB}); !isErr || !strings.Contains(text, "not_found") {
		t.Errorf("alice's kill_sandbox of beta's: %v %s", isErr, text)
	}
	viewer := connect("viewer")
	if isErr, text := viewer("kill_sandbox", map[string]any{"sandbox_id": sbA}); !isErr || !strings.Contains(text, "permission_denied") {
		t.Errorf("viewer's kill_sandbox: %v %s", isErr, text)
	}
	if _, err := tk.s.Engine.Get(sbB); err != nil {
		t.Errorf("beta's sandbox was killed: %v", err)
	}
}

// hexSHA256 is how a token store records a token.
func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
