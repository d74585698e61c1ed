package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
)

func TestRefTag(t *testing.T) {
	parse := func(s string) oci.Reference {
		r, err := oci.ParseReference(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ref := parse("Registry.Example.com:5000/team/py-pandas:v1.2")
	a, b := ReferenceTag("acme", ref), ReferenceTag("beta", ref)
	long := parse("r.example/" + strings.Repeat("x", 200) + ":" + strings.Repeat("T", 120))
	pinned := parse("r.example/team/py@sha256:" + strings.Repeat("ab", 32))
	for _, tag := range []string{a, b, ReferenceTag("", long), ReferenceTag("acme", pinned)} {
		if err := snapshot.ValidateTag(tag); err != nil || !snapshot.IsReservedTag(tag) {
			t.Errorf("ReferenceTag gave %q (%v): want a valid tag in the reserved namespace", tag, err)
		}
		if !regexp.MustCompile(`-[0-9a-f]{24}$`).MatchString(tag) {
			t.Errorf("ReferenceTag gave %q: want 96 bits of hash at its end", tag)
		}
	}
	if a == b || a != ReferenceTag("acme", ref) || !strings.HasPrefix(a, "ref--py-pandas-v1.2-") {
		t.Errorf("ReferenceTag: %q and %q for two tenants; want stable, readable and distinct", a, b)
	}
	if ReferenceTag("acme", parse("r.example/team/py:1")) == ReferenceTag("acme", parse("r.example/other/py:1")) {
		t.Error("two repositories with the same last component share a tag")
	}
	// The default tenant, spelled either way, is one tenant.
	if ReferenceTag("", ref) != ReferenceTag("default", ref) {
		t.Error("the default tenant's tag depends on how it is spelled")
	}
	if !strings.HasPrefix(ReferenceTag("acme", pinned), "ref--py-abababababab-") {
		t.Errorf("digest reference: %q", ReferenceTag("acme", pinned))
	}
}

// forkRegistry is an in-process registry (go-containerregistry's) holding
// one small snapshot, tagged shipped, at REPO:v1, that counts the blob
// and manifest GETs it serves; gate, if set, holds a manifest GET until
// it is closed.
type forkRegistry struct {
	host, repo      string
	blobs, manifest atomic.Int64
	mu              sync.Mutex
	gate            chan struct{}
	// rewrite, if set, replaces a manifest GET's answer (a registry or
	// proxy that alters it).
	rewrite func(path string) ([]byte, bool)
}

func startForkRegistry(t *testing.T, tk *tenancy) *forkRegistry {
	t.Helper()
	fr := &forkRegistry{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			fr.blobs.Add(1)
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
			fr.manifest.Add(1)
			fr.mu.Lock()
			gate, rewrite := fr.gate, fr.rewrite
			fr.mu.Unlock()
			if gate != nil {
				<-gate
			}
			if rewrite != nil {
				if body, ok := rewrite(r.URL.Path); ok {
					w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
					w.Write(body)
					return
				}
			}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	fr.host = strings.TrimPrefix(srv.URL, "http://")
	fr.repo = fr.host + "/forkd/api"
	fr.push(t, "shipped", "v1")
	fr.counts()                                // the push's
	tk.s.PrivateRegistries = []string{fr.host} // on loopback
	return fr
}

// push packs a new snapshot tagged tag (its image seeded by tag: one
// tag a test) and pushes it to REPO:regTag, returning the manifest's
// digest.
func (fr *forkRegistry) push(t *testing.T, tag, regTag string) string {
	t.Helper()
	src := t.TempDir()
	addSnapshot(t, src, tag, 64<<10)
	var archive bytes.Buffer
	if _, err := pack.Pack(context.Background(), src, tag, &archive, pack.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := oci.Push(context.Background(), &archive, fr.repo+":"+regTag, t.TempDir(), oci.Auth{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Digest
}

// counts returns and resets the GETs counted.
func (fr *forkRegistry) counts() (blobs, manifests int64) {
	return fr.blobs.Swap(0), fr.manifest.Swap(0)
}

// forkRef forks ref as who; the engine has no VMM, so a fork that got
// past its pull fails later, in the fork itself.
func (tk *tenancy) forkRef(who, ref, policy string) answer {
	tk.t.Helper()
	body := `{"tag":"` + ref + `","count":1`
	if policy != "" {
		body += `,"pull_policy":"` + policy + `"`
	}
	return tk.call(who, http.MethodPost, "/v1/sandboxes", body+"}", nil)
}

// pulledFor checks that tenant holds ref's snapshot under its derived tag,
// with its origin recorded, and returns the snapshot's ID.
func (tk *tenancy) pulledFor(tenant, ref string) string {
	tk.t.Helper()
	r, _ := oci.ParseReference(ref)
	tag := ReferenceTag(tenant, r)
	snap, err := tk.s.Engine.Store().Get(tag)
	if err != nil {
		tk.t.Fatalf("%s's copy of %s: %v", tenant, ref, err)
	}
	owner, origin, ok := tk.s.owners.origin(tag, snap.ID)
	if !ok || owner != tenant || origin.Ref != r.String() || !strings.HasPrefix(origin.Digest, "sha256:") {
		tk.t.Fatalf("%s's copy of %s under %s: owner %q origin %+v (%v)", tenant, ref, tag, owner, origin, ok)
	}
	return snap.ID
}

// TestForkByReference: a fork by reference pulls the snapshot for the
// caller's tenant on first use and not again; another tenant pulls its
// own; a planted copy under a tenant's derived tag is never forked; a
// digest reference is forked at its digest only.
func TestForkByReference(t *testing.T) {
	tk := newTenancy(t, nil)
	fr := startForkRegistry(t, tk)
	ref := fr.repo + ":v1"

	a := tk.forkRef("alice", ref, "")
	if strings.Contains(a.p.Detail, "fork of") {
		t.Fatalf("first fork by reference: %d %s, want its pull to succeed", a.status, a.body)
	}
	aliceID := tk.pulledFor("acme", ref)
	if blobs, _ := fr.counts(); blobs != 3 {
		t.Errorf("first fork by reference: %d blob GETs, want 3 (config, image, snapshot)", blobs)
	}
	tk.forkRef("alice", ref, "")
	if blobs, manifests := fr.counts(); blobs != 0 || manifests != 0 {
		t.Errorf("second fork by reference (if_not_present): %d blob and %d manifest GETs, want none", blobs, manifests)
	}
	// always: asks for the digest (a HEAD), fetches nothing unchanged.
	if a := tk.forkRef("alice", ref, apiv1.PullAlways); strings.Contains(a.p.Detail, "fork of") {
		t.Fatalf("fork with pull_policy always: %d %s", a.status, a.body)
	}
	if blobs, _ := fr.counts(); blobs != 0 || tk.pulledFor("acme", ref) != aliceID {
		t.Errorf("always with the registry unchanged: %d blob GETs or a new copy, want neither", blobs)
	}

	// Bob (tenant beta) cannot see alice's copy: he pulls his own.
	tk.forkRef("bob", ref, "")
	if blobs, _ := fr.counts(); blobs == 0 {
		t.Error("bob's fork by reference fetched nothing: did it use acme's copy?")
	}
	tk.pulledFor("beta", ref)
	r, _ := oci.ParseReference(ref)
	if ReferenceTag("acme", r) == ReferenceTag("beta", r) {
		t.Fatal("two tenants share a derived tag")
	}

	// The registry's tag moves: if_not_present keeps the held copy,
	// always pulls the new one (and replaces the copy).
	moved := fr.push(t, "shipped-2", "v1")
	fr.counts()
	tk.forkRef("alice", ref, "")
	if tk.pulledFor("acme", ref) != aliceID {
		t.Error("if_not_present pulled again after the registry's tag moved")
	}
	tk.forkRef("alice", ref, apiv1.PullAlways)
	if id := tk.pulledFor("acme", ref); id == aliceID {
		t.Error("always kept the old copy after the registry's tag moved")
	}
	_, origin, _ := tk.s.owners.origin(ReferenceTag("acme", r), tk.pulledFor("acme", ref))
	if origin.Digest != moved {
		t.Errorf("after always: origin digest %s, want the moved tag's %s", origin.Digest, moved)
	}

	// A digest reference: forked at that digest, under a tag of its own.
	pinned := fr.repo + "@" + moved
	if a := tk.forkRef("alice", pinned, ""); strings.Contains(a.p.Detail, "fork of") {
		t.Fatalf("fork by digest: %d %s", a.status, a.body)
	}
	tk.pulledFor("acme", pinned)
	absent := fr.repo + "@sha256:" + strings.Repeat("0", 64)
	if a := tk.forkRef("alice", absent, ""); a.status != http.StatusNotFound || !strings.Contains(a.p.Detail, "not found in registry") {
		t.Errorf("fork of a digest the registry lacks: %d %s, want 404 naming the registry", a.status, a.body)
	}
	if a := tk.forkRef("alice", fr.repo+":nope", ""); a.status != http.StatusNotFound || !strings.Contains(a.p.Detail, "fork of "+fr.repo+":nope") {
		t.Errorf("fork of a tag the registry lacks: %d %s, want 404 naming the reference", a.status, a.body)
	}
}

// TestForkByReferenceIgnoresPlantedCopies: whatever holds a tenant's
// derived tag without a record of that tenant's pull of that reference
// (a copy planted there past every check, a record of another tenant, a
// digest reference's copy at another digest) is never forked: the fork
// pulls and replaces it.
func TestForkByReferenceIgnoresPlantedCopies(t *testing.T) {
	tk := newTenancy(t, nil)
	fr := startForkRegistry(t, tk)
	ref := fr.repo + ":v1"
	digest := fr.push(t, "shipped-2", "v1")
	r, _ := oci.ParseReference(ref)
	pinnedRef, _ := oci.ParseReference(fr.repo + "@" + digest)
	store := tk.s.Engine.Store()
	for i, c := range []struct {
		name string
		ref  oci.Reference
		rec  func(tag, id string) state.SnapshotOwnerRecord
	}{
		{"no record", r, nil},
		{"acme's record", r, func(tag, id string) state.SnapshotOwnerRecord {
			return state.SnapshotOwnerRecord{Tag: tag, Tenant: "acme", SnapshotID: id, Origin: &state.SnapshotOrigin{Ref: r.String(), Digest: digest}}
		}},
		{"beta's record of another reference", r, func(tag, id string) state.SnapshotOwnerRecord {
			return state.SnapshotOwnerRecord{Tag: tag, Tenant: "beta", SnapshotID: id, Origin: &state.SnapshotOrigin{Ref: fr.repo + ":v2", Digest: digest}}
		}},
		{"another digest", pinnedRef, func(tag, id string) state.SnapshotOwnerRecord {
			return state.SnapshotOwnerRecord{Tag: tag, Tenant: "beta", SnapshotID: id, Origin: &state.SnapshotOrigin{Ref: pinnedRef.String(), Digest: "sha256:" + strings.Repeat("1", 64)}}
		}},
	} {
		tag := ReferenceTag("beta", c.ref)
		store.Remove(tag)
		// Past every check: made under another tag, moved there by hand.
		other := fmt.Sprintf("planted-%d", i)
		addSnapshot(t, tk.s.Engine.Config().DataDir, other, 4096)
		if err := os.Rename(filepath.Join(store.Root(), other), filepath.Join(store.Root(), tag)); err != nil {
			t.Fatal(err)
		}
		planted, err := store.Get(tag)
		if err != nil {
			t.Fatal(err)
		}
		tk.s.owners.forget(tag)
		if c.rec != nil {
			if err := tk.s.owners.putLocked(c.rec(tag, planted.ID)); err != nil {
				t.Fatal(err)
			}
		}
		tk.forkRef("bob", c.ref.String(), "")
		if id := tk.pulledFor("beta", c.ref.String()); id == planted.ID {
			t.Errorf("%s: bob's fork by reference used the copy planted under %s", c.name, tag)
		}
	}
}

// TestForkByReferenceDigestMismatch: a registry (or a proxy) that answers
// another manifest for a pinned digest is refused, and nothing is kept.
func TestForkByReferenceDigestMismatch(t *testing.T) {
	tk := newTenancy(t, nil)
	fr := startForkRegistry(t, tk)
	first := fr.push(t, "shipped-a", "v1")
	second := fr.push(t, "shipped-b", "v2")
	resp, err := http.Get("http://" + fr.host + "/v2/forkd/api/manifests/" + second)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fr.mu.Lock()
	fr.rewrite = func(path string) ([]byte, bool) { return other, strings.HasSuffix(path, first) }
	fr.mu.Unlock()
	pinned := fr.repo + "@" + first
	a := tk.forkRef("alice", pinned, "")
	if a.status != http.StatusBadRequest || !strings.Contains(a.p.Detail, "fork of "+pinned) || !strings.Contains(a.p.Detail, "altered") {
		t.Errorf("a digest answered with another manifest: %d %s, want 400 saying it was altered", a.status, a.body)
	}
	r, _ := oci.ParseReference(pinned)
	if _, err := tk.s.Engine.Store().Get(ReferenceTag("acme", r)); !errdefs.IsNotFound(err) {
		t.Errorf("the refused pull left %s: %v", ReferenceTag("acme", r), err)
	}
}

// TestForkByReferencePullsOnce: concurrent forks of one unpulled
// reference by one tenant share one pull, and all of them wait for it.
func TestForkByReferencePullsOnce(t *testing.T) {
	tk := newTenancy(t, nil)
	fr := startForkRegistry(t, tk)
	ref := fr.repo + ":v1"
	gate := make(chan struct{})
	fr.mu.Lock()
	fr.gate = gate
	fr.mu.Unlock()
	const n = 6
	answers := make(chan answer, n)
	for range n {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, tk.srv.URL+"/v1/sandboxes", strings.NewReader(`{"tag":"`+ref+`","count":1}`))
			req.Header.Set("Authorization", "Bearer "+tk.tok["alice"])
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{status: -1, body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers <- answer{status: resp.StatusCode, body: b}
		}()
	}
	// The first pull's manifest GET is held at the gate: every fork
	// arrives while that pull is in flight.
	waitUntil(t, func() bool { return fr.manifest.Load() >= 1 }, "the first pull to reach the registry")
	close(gate)
	for range n {
		a := <-answers
		if a.status < 0 || a.status == http.StatusUnsupportedMediaType || strings.Contains(string(a.body), "fork of") {
			t.Errorf("a concurrent fork by reference: %d %s", a.status, a.body)
		}
	}
	if blobs, manifests := fr.counts(); manifests != 1 || blobs != 3 {
		t.Errorf("%d concurrent forks of one reference: %d manifest and %d blob GETs, want one pull (1 and 3)", n, manifests, blobs)
	}
	tk.pulledFor("acme", ref)
}

// TestReservedTagsRefused: no request creates a tag in the reserved
// namespace: pull --tag, import ?tag=, snapshot create, compact, branch
// (the store refuses it too: internal/snapshot; and archives' own tags:
// internal/pack).
func TestReservedTagsRefused(t *testing.T) {
	tk := newTenancy(t, nil)
	fr := startForkRegistry(t, tk)
	r, _ := oci.ParseReference(fr.repo + ":v1")
	planted := ReferenceTag("beta", r) // bob's derived tag, which alice would plant
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/snapshots/pull", `{"ref":"` + fr.repo + `:v1","tag":"` + planted + `"}`},
		{"POST", "/v1/snapshots/import?tag=" + planted, "x"},
		{"POST", "/v1/snapshots", `{"tag":"` + planted + `","recipe":"minimal"}`},
		{"POST", "/v1/snapshots/a-base/compact", `{"to":"` + planted + `"}`},
		{"POST", "/v1/sandboxes/" + sbA + "/branch", `{"tag":"` + planted + `","mode":"diff"}`},
	} {
		for _, who := range []string{"alice", "ops"} {
			a := tk.call(who, c.method, c.path, c.body, map[string]string{"Prefer": "respond-async"})
			if a.status != http.StatusBadRequest || !strings.Contains(a.p.Detail, "reserves") {
				t.Errorf("%s %s as %s: %d %s, want 400 naming the reserved namespace", c.method, c.path, who, a.status, a.body)
			}
		}
	}
	if _, err := tk.s.Engine.Store().Get(planted); err == nil {
		t.Fatalf("%s was created", planted)
	}
	// pull_policy and credentials only go with a reference.
	for _, body := range []string{`{"tag":"a-base","count":1,"pull_policy":"always"}`, `{"tag":"` + fr.repo + `:v1","count":1,"pull_policy":"never"}`,
		`{"tag":"team/py:1","count":1}`} {
		if a := tk.call("alice", "POST", "/v1/sandboxes", body, nil); a.status != http.StatusBadRequest {
			t.Errorf("fork %s: %d %s, want 400", body, a.status, a.body)
		}
	}
	if blobs, manifests := fr.counts(); blobs+manifests != 0 {
		t.Errorf("refused requests reached the registry: %d blob and %d manifest GETs", blobs, manifests)
	}
}
