package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/forkd-dev/forkd/k8s/controller"
)

// snapDaemon is a stand-in node daemon for the snapshot routes: it holds
// snapshots owned by tenants ("default": the operator's) and answers as
// forkd does for an admin acting for a tenant (Forkd-Tenant, which every
// request must carry): the tenant's own and the operator's are visible,
// only its own removable, another tenant's are 404. It pages its lists
// two items at a time.
type snapDaemon struct {
	t    *testing.T
	srv  *httptest.Server
	mu   sync.Mutex
	down bool
	// snaps: tag -> owner, state
	snaps map[string][2]string
}

func newSnapDaemon(t *testing.T, snaps map[string][2]string) *snapDaemon {
	d := &snapDaemon{t: t, snaps: snaps}
	d.srv = httptest.NewServer(http.HandlerFunc(d.serve))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *snapDaemon) serve(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tenant := r.Header.Get(controller.ActForHeader)
	switch {
	case d.down:
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "shutting down")
		return
	case r.Header.Get("Authorization") != "Bearer "+nodeToken || tenant == "":
		d.t.Errorf("%s %s: token %q, acting for %q: the gateway must send the node token and act for a namespace", r.Method, r.URL, r.Header.Get("Authorization"), tenant)
		writeProblem(w, http.StatusUnauthorized, "unauthenticated", "no")
		return
	}
	view := func(tag string) map[string]any {
		s := d.snaps[tag]
		return map[string]any{"tag": tag, "owner": s[0], "state": s[1], "memory_mib": 256}
	}
	visible := func(tag string) bool {
		s, ok := d.snaps[tag]
		return ok && (s[0] == tenant || s[0] == "default")
	}
	tag := strings.TrimPrefix(r.URL.Path, "/v1/snapshots/")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/snapshots":
		var tags []string
		for t := range d.snaps {
			if visible(t) {
				tags = append(tags, t)
			}
		}
		slices.Sort(tags)
		if c := r.URL.Query().Get("cursor"); c != "" {
			i := slices.Index(tags, c)
			if i < 0 {
				writeProblem(w, 400, "invalid_argument", "bad cursor")
				return
			}
			tags = tags[i:]
		}
		page := map[string]any{}
		if len(tags) > 2 {
			page["next_cursor"] = tags[2]
			tags = tags[:2]
		}
		items := []map[string]any{}
		for _, t := range tags {
			items = append(items, view(t))
		}
		page["items"] = items
		writeJSON(w, 200, page)
	case !visible(tag):
		writeProblem(w, 404, "not_found", "no snapshot tagged "+tag)
	case r.Method == http.MethodGet:
		writeJSON(w, 200, view(tag))
	case r.Method == http.MethodDelete && d.snaps[tag][0] != tenant:
		writeProblem(w, 403, "permission_denied", `snapshot "`+tag+`" belongs to tenant "default"`)
	case r.Method == http.MethodDelete && d.snaps[tag][1] == "pinned":
		writeProblem(w, 409, "failed_precondition", `snapshot "`+tag+`" has dependents`)
	case r.Method == http.MethodDelete:
		delete(d.snaps, tag)
		writeJSON(w, 200, map[string][]string{"removed": {tag}})
	default:
		http.NotFound(w, r)
	}
}

// TestSnapshotRoutesAcrossNodes: the gateway's snapshot routes ask every
// node acting for the caller's namespace and merge the answers: a
// namespace lists its own snapshots and the operator's, each once with
// the nodes holding it (a ready copy described over one being written),
// never another namespace's; a node that does not answer is named in a
// Warning and makes a missing tag 503, not 404; DELETE removes a tag of
// the namespace's from every node and passes on a node's refusal.
func TestSnapshotRoutesAcrossNodes(t *testing.T) {
	n1 := newSnapDaemon(t, map[string][2]string{
		"py": {"default", "ready"}, "a-br": {"team-a", "ready"}, "b-br": {"team-b", "ready"}, "a-old": {"team-a", "ready"},
		"a-dep": {"team-a", "ready"},
	})
	n2 := newSnapDaemon(t, map[string][2]string{"py": {"default", "ready"}, "a-br": {"team-a", "writing"}, "a-new": {"team-a", "writing"},
		"a-dep": {"team-a", "pinned"}})
	n3 := newSnapDaemon(t, map[string][2]string{"py": {"default", "ready"}})
	g := &Gateway{
		Nodes: nodeMap{
			"n1": {Base: n1.srv.URL, Token: nodeToken}, "n2": {Base: n2.srv.URL, Token: nodeToken}, "n3": {Base: n3.srv.URL, Token: nodeToken},
		},
		Tokens: testTokens(t), DefaultNamespace: "forkd", Version: "test", Log: testr.New(t),
	}
	gw := httptest.NewServer(g.Handler())
	t.Cleanup(gw.Close)
	call := func(who, method, path string) (int, http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, gw.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+who+"-token")
		req.Header.Set(controller.ActForHeader, "team-b") // a caller's own is ignored
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}

	type item struct {
		Tag, State, Owner string
		Nodes             []string
	}
	st, hdr, b := call("alice", "GET", "/v1/snapshots")
	var list struct{ Items []item }
	if st != 200 || json.Unmarshal(b, &list) != nil {
		t.Fatalf("list: %d %s", st, b)
	}
	want := []item{
		{"a-br", "ready", "team-a", []string{"n1", "n2"}},
		{"a-dep", "ready", "team-a", []string{"n1", "n2"}},
		{"a-new", "writing", "team-a", []string{"n2"}},
		{"a-old", "ready", "team-a", []string{"n1"}},
		{"py", "ready", "default", []string{"n1", "n2", "n3"}},
	}
	if len(list.Items) != len(want) {
		t.Fatalf("alice lists %+v, want %+v", list.Items, want)
	}
	for i, w := range want {
		g := list.Items[i]
		if g.Tag != w.Tag || g.State != w.State || g.Owner != w.Owner || !slices.Equal(g.Nodes, w.Nodes) {
			t.Errorf("item %d: %+v, want %+v", i, g, w)
		}
	}
	if hdr.Get("Warning") != "" {
		t.Errorf("every node answered, yet Warning %q", hdr.Get("Warning"))
	}
	if st, _, b := call("bob", "GET", "/v1/snapshots/a-br"); st != 404 || !strings.Contains(string(b), `no snapshot tagged \"a-br\"`) {
		t.Errorf("bob's get of team-a's branch: %d %s", st, b)
	}
	if st, _, b := call("viewer", "GET", "/v1/snapshots/a-br"); st != 200 || !strings.Contains(string(b), `"state":"ready"`) {
		t.Errorf("viewer (team-a) get: %d %s", st, b)
	}

	// Removing: a reader may not; the operator's refused by its nodes;
	// the namespace's gone from every node.
	if st, _, _ := call("viewer", "DELETE", "/v1/snapshots/a-br"); st != 403 {
		t.Errorf("viewer's delete: %d", st)
	}
	if st, _, b := call("alice", "DELETE", "/v1/snapshots/py"); st != 403 || !strings.Contains(string(b), "node n1: ") {
		t.Errorf("alice removing the operator's py: %d %s", st, b)
	}
	if st, _, b := call("alice", "DELETE", "/v1/snapshots/a-br"); st != 200 || string(b) != "{\"removed\":[\"a-br\"]}\n" {
		t.Errorf("alice removing a-br: %d %s", st, b)
	}
	if _, ok := n2.snaps["a-br"]; ok {
		t.Error("a-br left on n2")
	}
	if st, _, _ := call("alice", "DELETE", "/v1/snapshots/a-br"); st != 404 {
		t.Errorf("removing a-br again: %d", st)
	}
	// One node refuses while another removes: the refusal, saying so.
	if st, _, b := call("alice", "DELETE", "/v1/snapshots/a-dep"); st != 409 || !strings.Contains(string(b), "node n2: ") ||
		!strings.Contains(string(b), "node(s) n1 removed it meanwhile") {
		t.Errorf("a delete refused by one node: %d %s", st, b)
	}

	// A node away: named, and a tag not found is not said to be absent.
	n3.mu.Lock()
	n3.down = true
	n3.mu.Unlock()
	st, hdr, b = call("alice", "GET", "/v1/snapshots")
	if st != 200 || !strings.Contains(hdr.Get("Warning"), "no answer from node(s) n3") || !strings.Contains(string(b), `"a-old"`) {
		t.Errorf("list with n3 away: %d %q %s", st, hdr.Get("Warning"), b)
	}
	if st, _, b := call("alice", "GET", "/v1/snapshots/a-br"); st != 503 || !strings.Contains(string(b), "node n3 did not answer") {
		t.Errorf("get of a removed tag with n3 away: %d %s", st, b)
	}

	// No node known (discovery not answered yet): 503, not an empty list.
	g.Nodes = nodeMap{}
	for _, path := range []string{"/v1/snapshots", "/v1/snapshots/py"} {
		if st, _, b := call("alice", "GET", path); st != 503 {
			t.Errorf("GET %s with no node known: %d %s", path, st, b)
		}
	}
}
