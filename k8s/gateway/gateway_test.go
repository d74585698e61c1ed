package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/controller"
)

const nodeToken = "node-secret"

// daemon is a stand-in node daemon for the gateway's proxying: it
// describes the sandboxes the test's controller stand-in "forked" and
// streams an exec's output; it checks the node token on every request.
type daemon struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string // METHOD PATH of every request
	// tenants are the Forkd-Tenant each request acted for.
	tenants []string
}

func newDaemon(t *testing.T) *daemon {
	d := &daemon{}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.seen = append(d.seen, r.Method+" "+r.URL.Path)
		d.tenants = append(d.tenants, r.Header.Get(controller.ActForHeader))
		d.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+nodeToken {
			http.Error(w, "wrong token", http.StatusUnauthorized)
			return
		}
		id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"), "/")
		switch {
		case r.Method == http.MethodGet && rest == "":
			writeJSON(w, 200, map[string]any{"id": id, "tag": "py", "state": "running", "created": time.Now().UTC(),
				"ready_ms": 12.5, "pooled": true, "last_activity": time.Now().UTC(), "tenant": ""})
		case r.Method == http.MethodPost && rest == "exec":
			var req struct{ Cmd []string }
			json.NewDecoder(r.Body).Decode(&req)
			w.Header().Set("Content-Type", "application/x-ndjson")
			fl := w.(http.Flusher)
			for _, a := range req.Cmd {
				fmt.Fprintf(w, "{\"stdout\":%q}\n", a)
				fl.Flush()
			}
			fmt.Fprintln(w, `{"exit_code":0}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(d.srv.Close)
	return d
}

type nodeMap map[string]*controller.NodeClient

func (m nodeMap) Client(n string) (*controller.NodeClient, bool) { c, ok := m[n]; return c, ok }
func (m nodeMap) All() map[string]*controller.NodeClient         { return m }

type kit struct {
	t      *testing.T
	gw     *httptest.Server
	c      client.Client
	daemon *daemon
}

// newKit: a gateway over a fake apiserver with the status subresource and
// the id index, one node, and tokens alice (user of team-a), bob (user of
// team-b), viewer (reader of team-a). Its controller stand-in runs every
// new Sandbox on node n1 with id sb-<name>, unless its tag is "full"
// (no room: a NoCapacity condition).
func newKit(t *testing.T, readyTimeout ...time.Duration) *kit {
	scheme, err := controller.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1.Sandbox{}).
		WithIndex(&v1.Sandbox{}, IndexSandboxID, SandboxIDOf).Build()
	d := newDaemon(t)
	g := &Gateway{
		Client: c, Nodes: nodeMap{"n1": {Base: d.srv.URL, Token: nodeToken}}, Tokens: testTokens(t),
		DefaultNamespace: "forkd", ReadyTimeout: 2 * time.Minute, Version: "test", Log: testr.New(t),
	}
	if len(readyTimeout) > 0 {
		g.ReadyTimeout = readyTimeout[0]
	}
	k := &kit{t: t, gw: httptest.NewServer(g.Handler()), c: c, daemon: d}
	t.Cleanup(k.gw.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go k.controller(ctx)
	return k
}

// testTokens: alice (user of team-a), bob (user of team-b), viewer
// (reader of team-a); each token is NAME-token.
func testTokens(t *testing.T) *Tokens {
	var store strings.Builder
	store.WriteString(`{"version":2,"tokens":[`)
	for i, e := range [][3]string{{"alice", "user", "team-a"}, {"bob", "user", "team-b"}, {"viewer", "reader", "team-a"}} {
		h := sha256.Sum256([]byte(e[0] + "-token"))
		if i > 0 {
			store.WriteString(",")
		}
		fmt.Fprintf(&store, `{"name":%q,"sha256":%q,"role":%q,"tenant":%q}`, e[0], hex.EncodeToString(h[:]), e[1], e[2])
	}
	store.WriteString(`]}`)
	toks, err := ParseTokens([]byte(store.String()))
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// controller plays the controller: every Sandbox without a phase gets
// one, and a deleted one loses its finalizer (which the gateway sets, so
// the real controller need not).
func (k *kit) controller(ctx context.Context) {
	for ctx.Err() == nil {
		var l v1.SandboxList
		if err := k.c.List(ctx, &l); err == nil {
			for i := range l.Items {
				sb := &l.Items[i]
				if !sb.DeletionTimestamp.IsZero() {
					if controllerutil.RemoveFinalizer(sb, controller.Finalizer) {
						k.c.Update(ctx, sb)
					}
					continue
				}
				if sb.Status.Phase != "" {
					continue
				}
				switch sb.Spec.Snapshot.Tag {
				case "full":
					sb.Status.Phase = v1.SandboxPending
					sb.Status.Conditions = []metav1.Condition{{Type: v1.ConditionPlaced, Status: metav1.ConditionFalse,
						Reason: v1.ReasonNoCapacity, Message: "no ready node has room", LastTransitionTime: metav1.Now()}}
				case "absent":
					sb.Status.Phase = v1.SandboxPending
					sb.Status.Conditions = []metav1.Condition{{Type: v1.ConditionPlaced, Status: metav1.ConditionFalse,
						Reason: v1.ReasonSnapshotNotFound, Message: `no node holds snapshot "absent"`, LastTransitionTime: metav1.Now()}}
				default:
					sb.Status.Phase, sb.Status.NodeName, sb.Status.SandboxID = v1.SandboxRunning, "n1", "sb-"+sb.Name
				}
				k.c.Status().Update(ctx, sb)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitGone waits, up to a minute, until no Sandbox is listed (the
// stand-in controller lets deleted ones go); it returns how many are left.
func (k *kit) waitGone(opts ...client.ListOption) (int, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		var l v1.SandboxList
		err := k.c.List(context.Background(), &l, opts...)
		if (err == nil && len(l.Items) == 0) || time.Now().After(deadline) {
			return len(l.Items), err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (k *kit) call(who, method, path, body string, hdr ...string) (int, []byte) {
	k.t.Helper()
	req, err := http.NewRequest(method, k.gw.URL+path, strings.NewReader(body))
	if err != nil {
		k.t.Fatal(err)
	}
	if who != "" {
		req.Header.Set("Authorization", "Bearer "+who+"-token")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type forkResponse struct {
	Sandboxes []struct {
		ID, State string
		Pooled    bool
	}
}

// TestForkProxyAndKill: a fork through the gateway becomes Sandboxes in
// the caller's namespace and answers with the daemons' descriptions; an
// exec is proxied to the node with the node's token, streamed; another
// tenant sees none of it; killing deletes the objects.
func TestForkProxyAndKill(t *testing.T) {
	k := newKit(t)
	st, b := k.call("alice", "POST", "/v1/sandboxes", `{"tag":"py","count":2,"timeout_s":600,"metadata":{"run":"r1"}}`)
	if st != http.StatusCreated {
		t.Fatalf("fork: %d %s", st, b)
	}
	var fr forkResponse
	if err := json.Unmarshal(b, &fr); err != nil || len(fr.Sandboxes) != 2 || !fr.Sandboxes[0].Pooled || fr.Sandboxes[0].State != "running" {
		t.Fatalf("fork answered %s (%v)", b, err)
	}
	id := fr.Sandboxes[0].ID
	var objs v1.SandboxList
	if err := k.c.List(context.Background(), &objs, client.InNamespace("team-a")); err != nil || len(objs.Items) != 2 {
		t.Fatalf("Sandboxes in team-a: %d (%v), want 2", len(objs.Items), err)
	}
	if lc := objs.Items[0].Spec.Lifecycle; lc == nil || lc.TimeoutSeconds == nil || *lc.TimeoutSeconds != 600 {
		t.Errorf("timeout_s not carried to the Sandbox: %+v", lc)
	}
	if f := objs.Items[0].Finalizers; !slices.Equal(f, []string{controller.Finalizer}) {
		t.Errorf("Sandbox created with finalizers %q, want the controller's (so it makes no write to add it)", f)
	}

	// Proxied, streamed, with the node's token.
	req, _ := http.NewRequest("POST", k.gw.URL+"/v1/sandboxes/"+id+"/exec", strings.NewReader(`{"cmd":["a","b"]}`))
	req.Header.Set("Authorization", "Bearer alice-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(lines) != 3 || lines[0] != `{"stdout":"a"}` || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("exec through the gateway: %d %q", resp.StatusCode, lines)
	}
	k.daemon.mu.Lock()
	acted := k.daemon.tenants[len(k.daemon.tenants)-1]
	k.daemon.mu.Unlock()
	if acted != "team-a" {
		t.Errorf("the exec reached the node acting for %q, want alice's namespace team-a", acted)
	}

	// Another tenant, and a reader's write.
	if st, b := k.call("bob", "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["x"]}`); st != 404 || !strings.Contains(string(b), "not_found") {
		t.Errorf("bob's exec in alice's sandbox: %d %s", st, b)
	}
	if st, b := k.call("bob", "GET", "/v1/sandboxes", ""); st != 200 || strings.Contains(string(b), id) {
		t.Errorf("bob's listing: %d %s", st, b)
	}
	if st, b := k.call("viewer", "POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["x"]}`); st != 403 || !strings.Contains(string(b), "needs the user or admin role") {
		t.Errorf("viewer's exec: %d %s", st, b)
	}
	if st, b := k.call("viewer", "GET", "/v1/sandboxes/"+id, ""); st != 200 || !strings.Contains(string(b), `"ready_ms":12.5`) {
		t.Errorf("viewer's get: %d %s", st, b)
	}
	if st, b := k.call("alice", "GET", "/v1/sandboxes?state=running&label=run=r1", ""); st != 200 || strings.Count(string(b), `"id"`) != 2 {
		t.Errorf("alice's listing: %d %s", st, b)
	}
	if st, b := k.call("alice", "GET", "/v1/sandboxes?label=run=r2", ""); st != 200 || strings.Contains(string(b), `"id"`) {
		t.Errorf("alice's listing of another run: %d %s", st, b)
	}

	// Kill one, delete the other.
	if st, b := k.call("alice", "POST", "/v1/sandboxes/kill", `{"ids":["`+id+`","sb-unknown"]}`); st != 200 || string(b) != `{"killed":["`+id+`"]}`+"\n" {
		t.Errorf("kill: %d %s", st, b)
	}
	if st, b := k.call("alice", "DELETE", "/v1/sandboxes/"+fr.Sandboxes[1].ID, ""); st != http.StatusNoContent {
		t.Errorf("delete: %d %s", st, b)
	}
	if n, err := k.waitGone(client.InNamespace("team-a")); n != 0 {
		t.Fatalf("Sandboxes left in team-a after kill and delete: %d (%v)", n, err)
	}
	k.daemon.mu.Lock()
	defer k.daemon.mu.Unlock()
	for _, s := range k.daemon.seen {
		if strings.Contains(s, "/kill") || strings.HasPrefix(s, "DELETE") {
			t.Errorf("the gateway sent %s to the node: deletion is the controller's (the Sandbox's finalizer)", s)
		}
	}
}

// TestForkIdempotentAndUndone: a retried fork with the same key returns
// the same sandboxes; a fork that finds no room answers 429 and leaves no
// object behind.
func TestForkIdempotentAndUndone(t *testing.T) {
	k := newKit(t)
	var ids [2]string
	for i := range ids {
		st, b := k.call("alice", "POST", "/v1/sandboxes", `{"tag":"py"}`, "Idempotency-Key", "k1")
		var fr forkResponse
		if st != 201 || json.Unmarshal(b, &fr) != nil || len(fr.Sandboxes) != 1 {
			t.Fatalf("fork %d: %d %s", i, st, b)
		}
		ids[i] = fr.Sandboxes[0].ID
	}
	if ids[0] != ids[1] {
		t.Fatalf("a retry with the same Idempotency-Key forked again: %s, then %s", ids[0], ids[1])
	}
	// bob's key k1 is his own.
	if st, b := k.call("bob", "POST", "/v1/sandboxes", `{"tag":"py"}`, "Idempotency-Key", "k1"); st != 201 || strings.Contains(string(b), ids[0]) {
		t.Fatalf("bob's fork with alice's key: %d %s", st, b)
	}

	// A fork that cannot run fails when its deadline passes; 5 s leaves the
	// stand-in controller room to record NoCapacity on a loaded machine.
	k2 := newKit(t, 5*time.Second)
	st, b := k2.call("alice", "POST", "/v1/sandboxes", `{"tag":"full","count":2}`)
	if st != http.StatusTooManyRequests || !strings.Contains(string(b), "no ready node has room") {
		t.Fatalf("fork with no room: %d %s", st, b)
	}
	if n, err := k2.waitGone(); n != 0 {
		t.Fatalf("a failed fork left %d Sandboxes (%v)", n, err)
	}
	// A tag no node holds for the namespace is a 404 at once (as a
	// daemon's), not the deadline's 429 or 504.
	k3 := newKit(t)
	st, b = k3.call("alice", "POST", "/v1/sandboxes", `{"tag":"absent"}`)
	if st != http.StatusNotFound || !strings.Contains(string(b), `no node holds snapshot \"absent\"`) {
		t.Fatalf("fork of a tag no node holds: %d %s", st, b)
	}
	if n, err := k3.waitGone(); n != 0 {
		t.Fatalf("a fork of an absent tag left %d Sandboxes (%v)", n, err)
	}
}

// TestBadRequests: errors name the problem and the fix.
func TestBadRequests(t *testing.T) {
	k := newKit(t)
	for _, c := range []struct {
		who, method, path, body string
		status                  int
		want                    string
	}{
		{"", "GET", "/v1/sandboxes", "", 401, "no bearer token"},
		{"mallory", "GET", "/v1/sandboxes", "", 401, "not one of the gateway's"},
		{"alice", "POST", "/v1/sandboxes", `{"count":1}`, 400, "tag is required"},
		{"alice", "POST", "/v1/sandboxes", `{"tag":"py","count":1000}`, 400, "want 1 to 100"},
		{"alice", "POST", "/v1/sandboxes", `{"tag":"py","recipe":"x"}`, 400, "unknown field"},
		{"alice", "POST", "/v1/snapshots", `{}`, 501, "build, push and pull base snapshots on the nodes"},
		{"alice", "GET", "/v1/sandboxes/sb-nope/files?path=/", "", 404, "in this token's namespace"},
		{"alice", "POST", "/v1/sandboxes/kill", `{}`, 400, "exactly one of ids and all"},
		{"alice", "POST", "/v1/sandboxes", `{"tag":"py","metadata":{"":"x"}}`, 400, "keys take 1 to 63 bytes"},
	} {
		if st, b := k.call(c.who, c.method, c.path, c.body); st != c.status || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %s %s as %q: %d %s, want %d with %q", c.method, c.path, c.body, c.who, st, b, c.status, c.want)
		}
	}
}
