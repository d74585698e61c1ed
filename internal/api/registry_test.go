package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// pushedArtifact pushes a small snapshot, tagged tag, to a registry the
// test serves on loopback (go-containerregistry's, in process) and
// returns the artifact's reference.
func pushedArtifact(t *testing.T, tag string) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	src := t.TempDir()
	addSnapshot(t, src, tag, 1<<20)
	var archive bytes.Buffer
	if _, err := pack.Pack(context.Background(), src, tag, &archive, pack.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(srv.URL, "http://") + "/forkd/api:v1"
	if _, err := oci.Push(context.Background(), &archive, ref, t.TempDir(), oci.Auth{}, nil); err != nil {
		t.Fatal(err)
	}
	return ref
}

// pull starts POST /v1/snapshots/pull as who, asynchronously, and waits
// for its operation to end.
func (tk *tenancy) pull(who, body string, hdr map[string]string) (answer, apiv1.Operation) {
	tk.t.Helper()
	h := map[string]string{"Prefer": "respond-async"}
	for k, v := range hdr {
		h[k] = v
	}
	a := tk.call(who, "POST", "/v1/snapshots/pull", body, h)
	var op apiv1.Operation
	if a.status != http.StatusAccepted || json.Unmarshal(a.body, &op) != nil || op.Kind != apiv1.OpSnapshotPull {
		tk.t.Fatalf("POST /v1/snapshots/pull %s: %d %s", body, a.status, a.body)
	}
	op, err := tk.s.ops.wait(context.Background(), op.ID)
	if err != nil {
		tk.t.Fatal(err)
	}
	return a, op
}

// TestPullRefusesBadInput: a reference or tag that cannot be right is a
// 400 at once, with no operation started.
func TestPullRefusesBadInput(t *testing.T) {
	tk := newTenancy(t, nil)
	for _, c := range []struct{ body, want string }{
		{`{}`, "no reference"},
		{`{"ref":"no-registry"}`, `reference "no-registry"`},
		{`{"ref":"127.0.0.1:5000/forkd/x"}`, "names no tag or digest"},
		{`{"ref":"127.0.0.1:5000/Forkd/x:v1"}`, "Forkd"},
		{`{"ref":"127.0.0.1:5000/forkd/x:v1","tag":"Not A Tag"}`, "tag"},
		{`{"ref":"127.0.0.1:5000/forkd/x:v1","verify_key":"junk"}`, "verify_key"},
	} {
		a := tk.call("alice", "POST", "/v1/snapshots/pull", c.body, nil)
		if a.status != http.StatusBadRequest || a.p.Code != "invalid_argument" || !strings.Contains(a.p.Detail, c.want) {
			t.Errorf("%s: %d %s, want 400 saying %q", c.body, a.status, a.body, c.want)
		}
	}
	if a := tk.call("alice", "POST", "/v1/snapshots/pull", `{"ref":"127.0.0.1:5000/forkd/x:v1","force":true}`, nil); a.status != http.StatusForbidden {
		t.Errorf("force as a user: %d %s, want 403", a.status, a.body)
	}
	if ops := listAs[apiv1.Operation](tk, "ops", "/v1/operations"); len(ops) != 0 {
		t.Errorf("refused pulls started operations: %+v", ops)
	}
}

// TestPullRegistryErrors: a registry that lacks the reference, or that
// cannot be reached, fails the operation with the class and a message
// naming the reference or the registry.
func TestPullRegistryErrors(t *testing.T) {
	tk := newTenancy(t, nil)
	ref := pushedArtifact(t, "shipped")
	host := strings.SplitN(ref, "/", 2)[0]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String() // nothing listens once closed
	ln.Close()
	// Both are on loopback: tenants reach them only once listed.
	for _, c := range []struct{ ref, code, want string }{
		{host + "/forkd/api:v1", "permission_denied", "is not public"},
		{closed + "/forkd/api:v1", "permission_denied", "is not public"},
	} {
		if _, op := tk.pull("alice", `{"ref":"`+c.ref+`"}`, nil); op.State != apiv1.OpFailed || op.Error == nil || op.Error.Code != c.code || !strings.Contains(op.Error.Detail, c.want) {
			t.Errorf("pull %s from an unlisted private registry: %s %+v, want failed %s saying %q", c.ref, op.State, op.Error, c.code, c.want)
		}
	}
	tk.s.PrivateRegistries = []string{host, closed}
	for _, c := range []struct{ ref, code, want string }{
		{host + "/forkd/api:nope", "not_found", host + "/forkd/api:nope"},
		{closed + "/forkd/api:v1", "unavailable", "registry " + closed + " unreachable"},
	} {
		_, op := tk.pull("alice", `{"ref":"`+c.ref+`"}`, nil)
		if op.State != apiv1.OpFailed || op.Error == nil || op.Error.Code != c.code || !strings.Contains(op.Error.Detail, c.want) {
			t.Errorf("pull %s: %s %+v, want failed %s saying %q", c.ref, op.State, op.Error, c.code, c.want)
		}
		if op.Target != c.ref || op.Tenant != "acme" {
			t.Errorf("pull %s: operation %+v", c.ref, op)
		}
	}
	if _, err := tk.s.Engine.Store().Get("shipped"); err == nil {
		t.Error("a failed pull left a tag")
	}
}

// TestPullIsAnOperation: a pull reports each part in its progress and
// ends with the snapshot, owned by the puller's tenant; a retry with the
// same Idempotency-Key follows the same operation instead of pulling
// again; and a pull holds a build slot, so one past the daemon's slots
// is a 429.
func TestPullIsAnOperation(t *testing.T) {
	tk := newTenancy(t, func(c *sandbox.Config) { c.MaxConcurrentBuilds = 2 })
	ref := pushedArtifact(t, "shipped")
	tk.s.PrivateRegistries = []string{strings.SplitN(ref, "/", 2)[0]} // on loopback
	body := `{"ref":"` + ref + `","tag":"pulled"}`
	key := map[string]string{apiv1.IdempotencyKeyHeader: "pull-1"}
	_, op := tk.pull("alice", body, key)
	if op.State != apiv1.OpSucceeded || op.Target != "pulled" {
		t.Fatalf("pull: %+v", op)
	}
	var snap apiv1.Snapshot
	if err := json.Unmarshal(op.Result, &snap); err != nil || snap.Tag != "pulled" || snap.Owner != "acme" {
		t.Fatalf("result %s (%v), want the snapshot pulled of acme", op.Result, err)
	}
	for _, want := range []string{"image/", "snapshot/", "fetched 2 of 2 parts"} {
		if !slices.ContainsFunc(op.Progress, func(l string) bool { return strings.Contains(l, want) }) {
			t.Errorf("progress %q says nothing of %q", op.Progress, want)
		}
	}
	if a := tk.call("alice", "GET", "/v1/snapshots/pulled", "", nil); a.status != http.StatusOK {
		t.Errorf("GET the pulled tag: %d %s", a.status, a.body)
	}

	// The retry: the same operation, replayed; no second pull (which
	// would fail: the tag exists).
	a := tk.call("alice", "POST", "/v1/snapshots/pull", body, map[string]string{"Prefer": "respond-async", apiv1.IdempotencyKeyHeader: "pull-1"})
	var again apiv1.Operation
	if json.Unmarshal(a.body, &again); a.status != http.StatusAccepted || again.ID != op.ID || a.header.Get(apiv1.IdempotentReplayedHeader) != "true" {
		t.Errorf("retry with the key: %d %v %s, want operation %s replayed", a.status, a.header, a.body, op.ID)
	}
	if ops := listAs[apiv1.Operation](tk, "alice", "/v1/operations"); len(ops) != 1 {
		t.Errorf("after the retry: %d operations, want 1", len(ops))
	}

	// Every build slot taken: a pull is refused at once, 429.
	for range 2 {
		slot, err := tk.s.Engine.TryAcquireBuild("create snapshot held", "", sandbox.TenantQuota{})
		if err != nil {
			t.Fatal(err)
		}
		defer slot.Release()
	}
	a = tk.call("ops", "POST", "/v1/snapshots/pull", `{"ref":"`+ref+`","tag":"flood"}`, map[string]string{"Prefer": "respond-async"})
	if a.status != http.StatusTooManyRequests || a.p.Code != "resource_exhausted" || a.header.Get("Retry-After") == "" || !strings.Contains(a.p.Detail, "pull "+ref) {
		t.Errorf("pull with every build slot taken: %d %v %s", a.status, a.header, a.body)
	}
}

// A tenant may build from a registry image (from, a Dockerfile, its own
// recipe's from), but pulled only with the credentials it sent, never the
// daemon's docker logins, and from public addresses only unless the
// operator allowed the registry; its step cache is its own. An admin's
// build, and a recipe the daemon installed, keep the daemon's logins.
func TestTenantBuildsPullAsTheTenant(t *testing.T) {
	recipes := t.TempDir()
	if err := os.WriteFile(filepath.Join(recipes, "inst.toml"), []byte("name = 'inst'\nfrom = '10.0.0.5:5000/app:v1'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tk := newTenancy(t, func(c *sandbox.Config) { c.RecipeDirs = []string{recipes} })
	tk.s.PrivateRegistries = []string{"10.0.0.9:5000"}
	got := make(chan sandbox.CreateSnapshotOptions, 1)
	tk.s.createSnapshotFn = func(ctx context.Context, opts sandbox.CreateSnapshotOptions) (*snapshot.Snapshot, error) {
		opts.Slot.Release()
		got <- opts
		return nil, context.Canceled
	}
	create := func(who, body string) sandbox.CreateSnapshotOptions {
		t.Helper()
		a := tk.call(who, "POST", "/v1/snapshots", body, map[string]string{"Prefer": "respond-async"})
		if a.status != http.StatusAccepted {
			t.Fatalf("%s: %s: %d %s", who, body, a.status, a.body)
		}
		return <-got
	}
	for _, c := range []struct {
		who, body  string
		publicOnly bool
		ownCreds   bool // a keychain of the request's credentials (or anonymous)
		tenant     string
	}{
		{"alice", `{"tag":"t1","recipe_toml":"name = 'img'\nfrom = '10.0.0.5:5000/app:v1'\n"}`, true, true, "acme"},
		{"alice", `{"tag":"t2","from":"10.0.0.5:5000/app:v1","registry_username":"u","registry_password":"p"}`, true, true, "acme"},
		{"alice", `{"tag":"t3","dockerfile":"FROM 10.0.0.9:5000/app:v1\nRUN true\n"}`, false, true, "acme"},
		{"ops", `{"tag":"t4","from":"10.0.0.5:5000/app:v1"}`, false, false, ""},
		{"alice", `{"tag":"t5","recipe":"inst"}`, false, false, "acme"},
	} {
		o := create(c.who, c.body)
		if o.Registry.PublicOnly != c.publicOnly || (o.Registry.Keychain != nil) != c.ownCreds || o.Tenant != c.tenant {
			t.Errorf("%s %s: registry %+v, tenant %q; want public only %v, own credentials %v, tenant %q",
				c.who, c.body, o.Registry, o.Tenant, c.publicOnly, c.ownCreds, c.tenant)
		}
	}
}
