package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
)

// Sandboxes of the tenancy fixture, recorded dead by "an earlier daemon"
// (the engine lists them without a VMM): one of tenant acme, one of
// tenant beta, one from before tenants existed.
const (
	sbA      = "sb-aaaaaaaaaa"
	sbB      = "sb-bbbbbbbbbb"
	sbOld    = "sb-oooooooooo"
	sbAbsent = "sb-zzzzzzzzzz"
)

// tenancy is a Server over TCP with tokens of several roles and tenants,
// snapshots owned by two tenants (and one by nobody), and dead sandboxes
// of each: no VMM is ever started.
type tenancy struct {
	t        *testing.T
	s        *Server
	srv      *httptest.Server
	st       *state.Store
	auditDir string
	tok      map[string]string // by token name
}

// Tokens: ops (admin), alice (user of acme), bob (user of beta), viewer
// (read-only of acme).
func newTenancy(t *testing.T, change func(*sandbox.Config)) *tenancy {
	t.Helper()
	dataDir := t.TempDir()
	for _, tag := range []string{"a-base", "b-base", "legacy"} {
		addSnapshot(t, dataDir, tag, 4096)
	}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	created := time.Now().UTC()
	for _, r := range []state.SandboxRecord{
		{ID: sbA, Tag: "a-base", State: apiv1.StateDead, Tenant: "acme", Created: created},
		{ID: sbB, Tag: "b-base", State: apiv1.StateDead, Tenant: "beta", Created: created.Add(time.Second)},
		{ID: sbOld, Tag: "legacy", State: apiv1.StateDead, Created: created.Add(2 * time.Second)},
	} {
		if err := st.PutSandbox(r); err != nil {
			t.Fatal(err)
		}
	}
	snaps, err := snapshot.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for tag, tenant := range map[string]string{"a-base": "acme", "b-base": "beta"} {
		snap, err := snaps.Get(tag)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.PutSnapshotOwner(state.SnapshotOwnerRecord{Tag: tag, Tenant: tenant, SnapshotID: snap.ID}); err != nil {
			t.Fatal(err)
		}
	}
	e := nopEngine(t, dataDir, "fkte", func(c *sandbox.Config) {
		c.State = st
		if change != nil {
			change(c)
		}
	})
	tokens, err := auth.Open(filepath.Join(t.TempDir(), auth.StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	tk := &tenancy{t: t, st: st, tok: map[string]string{}, auditDir: filepath.Join(t.TempDir(), "audit")}
	for _, c := range []struct {
		name, tenant string
		role         auth.Role
	}{
		{"ops", "", auth.RoleAdmin}, {"alice", "acme", auth.RoleUser}, {"bob", "beta", auth.RoleUser}, {"viewer", "acme", auth.RoleReadOnly},
	} {
		if tk.tok[c.name], err = tokens.Create(c.name, c.role, c.tenant); err != nil {
			t.Fatal(err)
		}
	}
	log, err := audit.Open(tk.auditDir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	tk.s = &Server{Engine: e, Version: "test", Tokens: tokens, Audit: log}
	if err := tk.s.LoadState(st); err != nil {
		t.Fatal(err)
	}
	tk.srv = httptest.NewServer(tk.s.Handler())
	t.Cleanup(tk.srv.Close)
	return tk
}

// answer is one HTTP answer, with its problem if it is one.
type answer struct {
	status int
	header http.Header
	body   []byte
	p      apiv1.Problem
}

// call sends one request as the token named who.
func (tk *tenancy) call(who, method, path, body string, hdr map[string]string) answer {
	tk.t.Helper()
	req, err := http.NewRequest(method, tk.srv.URL+path, strings.NewReader(body))
	if err != nil {
		tk.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tk.tok[who])
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tk.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	a.body, _ = io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		json.Unmarshal(a.body, &a.p)
	}
	return a
}

// getJSON GETs path as who into out, which must answer 200.
func (tk *tenancy) getJSON(who, path string, out any) {
	tk.t.Helper()
	a := tk.call(who, http.MethodGet, path, "", nil)
	if a.status != http.StatusOK {
		tk.t.Fatalf("GET %s as %s: %d %s", path, who, a.status, a.body)
	}
	if err := json.Unmarshal(a.body, out); err != nil {
		tk.t.Fatalf("GET %s: %v", path, err)
	}
}

// routeCase is one request naming an object ({} in path or body).
type routeCase struct {
	method, path, body string
	hdr                map[string]string
}

func (c routeCase) with(obj string) (path, body string) {
	return strings.ReplaceAll(c.path, "{}", obj), strings.ReplaceAll(c.body, "{}", obj)
}

var execHeader = map[string]string{apiv1.ExecHeader: `{"argv":["true"]}`, "Accept": "application/json"}

// sandboxRoutes are the routes that name a sandbox, the refused ones
// (DELETE, kill) last.
var sandboxRoutes = []routeCase{
	{method: "GET", path: "/v1/sandboxes/{}"},
	{method: "POST", path: "/v1/sandboxes/{}/exec", hdr: execHeader},
	{method: "POST", path: "/v1/sandboxes/{}/run_code", body: `{"code":"1"}`},
	{method: "POST", path: "/v1/sandboxes/{}/run_code/stream", body: `{"code":"1"}`},
	{method: "GET", path: "/v1/sandboxes/{}/processes"},
	{method: "POST", path: "/v1/sandboxes/{}/processes/7/stdin"},
	{method: "POST", path: "/v1/sandboxes/{}/processes/7/signal"},
	{method: "GET", path: "/v1/sandboxes/{}/files?path=/etc/hostname"},
	{method: "PUT", path: "/v1/sandboxes/{}/files?path=/tmp/x", body: "data"},
	{method: "DELETE", path: "/v1/sandboxes/{}/files?path=/tmp/x"},
	{method: "GET", path: "/v1/sandboxes/{}/files/list?path=/"},
	{method: "GET", path: "/v1/sandboxes/{}/files/stat?path=/"},
	{method: "POST", path: "/v1/sandboxes/{}/files/mkdir", body: `{"path":"/tmp/d"}`},
	{method: "GET", path: "/v1/sandboxes/{}/ports/8080"},
	{method: "GET", path: "/v1/sandboxes/{}/ports/8080", hdr: map[string]string{"Upgrade": "tcp", "Connection": "Upgrade"}}, // a tunnel
	{method: "GET", path: "/v1/sandboxes/{}/ports/8080/index.html"},
	{method: "POST", path: "/v1/sandboxes/{}/ports/8080/api"},
	{method: "POST", path: "/v1/sandboxes/{}/branch", body: `{"tag":"stolen"}`},
	{method: "GET", path: "/v1/sandboxes/{}/network"},
	{method: "PUT", path: "/v1/sandboxes/{}/network", body: `{"mode":"none"}`},
	{method: "POST", path: "/v1/sandboxes/kill", body: `{"ids":["{}"]}`},
	{method: "DELETE", path: "/v1/sandboxes/{}"},
}

// TestOtherTenantsSandboxesAre404: a user token of tenant acme gets, on
// every route that names a sandbox of tenant beta, the very 404 it gets
// for a sandbox that does not exist; the owner gets past authorization
// (the sandbox is dead, so most routes then refuse it otherwise).
func TestOtherTenantsSandboxesAre404(t *testing.T) {
	tk := newTenancy(t, nil)
	for _, c := range sandboxRoutes {
		hidden, hiddenBody := c.with(sbB)
		absent, absentBody := c.with(sbAbsent)
		got := tk.call("alice", c.method, hidden, hiddenBody, c.hdr)
		want := tk.call("alice", c.method, absent, absentBody, c.hdr)
		if got.status != http.StatusNotFound || got.p.Code != "not_found" {
			t.Errorf("alice %s %s: %d %s, want 404", c.method, hidden, got.status, got.body)
			continue
		}
		if strings.ReplaceAll(got.p.Detail, sbB, sbAbsent) != want.p.Detail || want.status != http.StatusNotFound {
			t.Errorf("%s %s: another tenant's sandbox reads %q, a missing one %d %q", c.method, c.path, got.p.Detail, want.status, want.p.Detail)
		}
	}
	// The owner and an admin get past authorization.
	for _, c := range sandboxRoutes {
		for _, who := range []string{"bob", "ops"} {
			path, body := c.with(sbB)
			if c.method == "DELETE" && c.path == "/v1/sandboxes/{}" || strings.HasSuffix(c.path, "/kill") {
				continue // would kill it for the next ones
			}
			if a := tk.call(who, c.method, path, body, c.hdr); a.status == http.StatusNotFound && strings.Contains(a.p.Detail, "no sandbox") || a.status == http.StatusForbidden {
				t.Errorf("%s %s %s: %d %s", who, c.method, path, a.status, a.body)
			}
		}
	}
	if a := tk.call("bob", "POST", "/v1/sandboxes/kill", `{"ids":["`+sbB+`"]}`, nil); a.status != http.StatusOK || !strings.Contains(string(a.body), sbB) {
		t.Errorf("owner's kill: %d %s", a.status, a.body)
	}
}

// TestListingsAreScoped: lists hold the caller's tenant's objects only; an
// admin's hold everyone's, the default tenant's (from before tenants)
// included; kill all kills one's own only.
func TestListingsAreScoped(t *testing.T) {
	tk := newTenancy(t, nil)
	opB := tk.s.ops.start("image.build", "beta-recipe", "beta")
	ids := func(who string) string {
		sbs := listAs[apiv1.Sandbox](tk, who, "/v1/sandboxes")
		var out []string
		for _, sb := range sbs {
			out = append(out, sb.ID+"@"+sb.Tenant)
		}
		sort.Strings(out)
		return strings.Join(out, " ")
	}
	tags := func(who string) string {
		snaps := listAs[apiv1.Snapshot](tk, who, "/v1/snapshots")
		var out []string
		for _, s := range snaps {
			out = append(out, s.Tag+"@"+s.Owner)
		}
		sort.Strings(out)
		return strings.Join(out, " ")
	}
	ops := func(who string) int {
		list := listAs[apiv1.Operation](tk, who, "/v1/operations")
		return len(list)
	}
	for who, want := range map[string]string{
		"alice":  sbA + "@acme",
		"viewer": sbA + "@acme",
		"bob":    sbB + "@beta",
		"ops":    sbA + "@acme " + sbB + "@beta " + sbOld + "@default",
	} {
		if got := ids(who); got != want {
			t.Errorf("%s lists sandboxes %q, want %q", who, got, want)
		}
	}
	for who, want := range map[string]string{
		"alice": "a-base@acme",
		"bob":   "b-base@beta",
		"ops":   "a-base@acme b-base@beta legacy@default",
	} {
		if got := tags(who); got != want {
			t.Errorf("%s lists snapshots %q, want %q", who, got, want)
		}
	}
	if ops("alice") != 0 || ops("bob") != 1 || ops("ops") != 1 {
		t.Errorf("operations: alice %d, bob %d, ops %d", ops("alice"), ops("bob"), ops("ops"))
	}
	got := tk.call("alice", "GET", "/v1/operations/"+opB.ID, "", nil)
	want := tk.call("alice", "GET", "/v1/operations/op-absent", "", nil)
	if got.status != 404 || strings.ReplaceAll(got.p.Detail, opB.ID, "op-absent") != want.p.Detail {
		t.Errorf("another tenant's operation: %d %q, a missing one %q", got.status, got.p.Detail, want.p.Detail)
	}
	// Kill all: alice's only.
	var kr apiv1.KillResponse
	a := tk.call("alice", "POST", "/v1/sandboxes/kill", `{"all":true}`, nil)
	if json.Unmarshal(a.body, &kr); a.status != 200 || strings.Join(kr.Killed, ",") != sbA {
		t.Errorf("alice kill all: %d %s", a.status, a.body)
	}
	if got := ids("ops"); got != sbB+"@beta "+sbOld+"@default" {
		t.Errorf("after alice's kill all: %q", got)
	}
	// The version hides the host's layout from non-admins.
	var v apiv1.Version
	if tk.getJSON("alice", "/v1/version", &v); v.DataDir != "" {
		t.Errorf("alice sees data_dir %q", v.DataDir)
	}
	if tk.getJSON("ops", "/v1/version", &v); v.DataDir == "" {
		t.Error("admin does not see data_dir")
	}
}

// snapshotRoutes name a snapshot tag.
var snapshotRoutes = []routeCase{
	{method: "GET", path: "/v1/snapshots/{}"},
	{method: "DELETE", path: "/v1/snapshots/{}"},
	{method: "GET", path: "/v1/snapshots/{}/archive"},
	{method: "POST", path: "/v1/snapshots/{}/compact", body: `{"to":"copy"}`},
	{method: "PUT", path: "/v1/snapshots/{}/shares/acme"},
	{method: "DELETE", path: "/v1/snapshots/{}/shares/acme"},
	{method: "POST", path: "/v1/sandboxes", body: `{"tag":"{}","count":1}`},
}

// TestOtherTenantsSnapshotsAre404: the same for snapshot tags, whose
// not-found error lists only the tags the caller sees.
func TestOtherTenantsSnapshotsAre404(t *testing.T) {
	tk := newTenancy(t, nil)
	for _, hidden := range []string{"b-base", "legacy"} {
		for _, c := range snapshotRoutes {
			path, body := c.with(hidden)
			got := tk.call("alice", c.method, path, body, c.hdr)
			apath, abody := c.with("absent")
			want := tk.call("alice", c.method, apath, abody, c.hdr)
			if got.status != 404 || want.status != 404 || strings.ReplaceAll(got.p.Detail, hidden, "absent") != want.p.Detail {
				t.Errorf("alice %s %s: %d %q; for a missing tag %d %q", c.method, path, got.status, got.p.Detail, want.status, want.p.Detail)
			}
			if !strings.Contains(got.p.Detail, "(existing tags: a-base)") {
				t.Errorf("alice %s %s: the error lists other tags: %q", c.method, path, got.p.Detail)
			}
		}
	}
}

// TestReadOnlyMayOnlyRead: a read-only token reads its tenant's objects
// and is refused every write with 403 naming the role needed; a user or
// read-only token is refused the admin routes the same way.
func TestReadOnlyMayOnlyRead(t *testing.T) {
	tk := newTenancy(t, nil)
	for _, c := range sandboxRoutes {
		path, body := c.with(sbA)
		a := tk.call("viewer", c.method, path, body, c.hdr)
		write := c.method != "GET" || c.hdr["Upgrade"] != ""
		switch {
		case write && (a.status != 403 || a.p.Code != "permission_denied" ||
			!strings.Contains(a.p.Detail, `token "viewer" (read-only of tenant "acme") may not call `+c.method+" ") ||
			!strings.Contains(a.p.Detail, "it needs the user or admin role")):
			t.Errorf("viewer %s %s: %d %s, want 403 naming the role", c.method, path, a.status, a.body)
		case !write && (a.status == 403 || a.status == 404 && strings.Contains(a.p.Detail, "no sandbox")):
			t.Errorf("viewer %s %s (a read): %d %s", c.method, path, a.status, a.body)
		}
	}
	for _, c := range []routeCase{
		{method: "POST", path: "/v1/sandboxes", body: `{"tag":"a-base","count":1}`},
		{method: "POST", path: "/v1/snapshots", body: `{"tag":"new","recipe":"minimal"}`},
		{method: "DELETE", path: "/v1/snapshots/a-base"},
		{method: "PUT", path: "/v1/snapshots/a-base/shares/beta"},
		{method: "POST", path: "/v1/snapshots/import", body: "x"},
	} {
		if a := tk.call("viewer", c.method, c.path, c.body, nil); a.status != 403 || !strings.Contains(a.p.Detail, "needs the user or admin role") {
			t.Errorf("viewer %s %s: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	for _, who := range []string{"alice", "viewer"} {
		for _, c := range []routeCase{
			{method: "GET", path: "/metrics"},
			{method: "GET", path: "/v1/doctor"},
			{method: "GET", path: "/v1/images"},
			{method: "POST", path: "/v1/images", body: `{"recipe":"minimal"}`},
			{method: "PUT", path: "/v1/tenants/acme/quota", body: `{"max_sandboxes":100,"max_memory_mib":0}`},
		} {
			if a := tk.call(who, c.method, c.path, c.body, nil); a.status != 403 || !strings.Contains(a.p.Detail, "it needs the admin role") {
				t.Errorf("%s %s %s: %d %s, want 403 naming the admin role", who, c.method, c.path, a.status, a.body)
			}
		}
	}
	// Forced imports (over existing tags) are the admin's.
	if a := tk.call("alice", "POST", "/v1/snapshots/import?force=true", "x", map[string]string{"Content-Type": "application/octet-stream"}); a.status != 403 ||
		!strings.Contains(a.p.Detail, "needs the admin role") {
		t.Errorf("alice's forced import: %d %s", a.status, a.body)
	}
}

// TestEveryRouteHasAPolicy: a route without a policy would be admin-only
// by default; each registered route is decided explicitly.
func TestEveryRouteHasAPolicy(t *testing.T) {
	for pattern, pos := range registeredPatterns(t) {
		if _, ok := routePolicies[pattern]; !ok {
			t.Errorf("route %q (%s) has no entry in routePolicies (authorize.go)", pattern, pos)
		}
	}
	for pattern := range routePolicies {
		if _, ok := registeredPatterns(t)[pattern]; !ok && pattern != "" {
			t.Errorf("routePolicies has %q, which no route registers", pattern)
		}
	}
}
