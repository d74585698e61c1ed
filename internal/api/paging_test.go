package api

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
)

// listAs lists every item of path (filters in its query) as who.
func listAs[T any](tk *tenancy, who, path string) []T {
	tk.t.Helper()
	return walkPages[T](tk, who, path, 0, nil)
}

// walkPages follows next_cursor from the first page of path as who, limit
// items a page (0: the default), and returns the items in order; between
// is called after each page but the last.
func walkPages[T any](tk *tenancy, who, path string, limit int, between func(page int)) []T {
	tk.t.Helper()
	u, err := url.Parse(path)
	if err != nil {
		tk.t.Fatal(err)
	}
	q := u.Query()
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	out := []T{}
	for page := 0; ; page++ {
		if page > 1000 {
			tk.t.Fatalf("GET %s as %s: more than 1000 pages", path, who)
		}
		u.RawQuery = q.Encode()
		var got apiv1.List[T]
		tk.getJSON(who, u.String(), &got)
		if limit > 0 && len(got.Items) > limit {
			tk.t.Fatalf("GET %s: %d items, over limit %d", u, len(got.Items), limit)
		}
		if got.NextCursor != "" && len(got.Items) == 0 {
			tk.t.Fatalf("GET %s: an empty page with a next_cursor", u)
		}
		out = append(out, got.Items...)
		if got.NextCursor == "" {
			return out
		}
		if between != nil {
			between(page)
		}
		q.Set("cursor", got.NextCursor)
	}
}

func opIDs(ops []apiv1.Operation) []string {
	var out []string
	for _, o := range ops {
		out = append(out, o.ID+"@"+o.Tenant)
	}
	return out
}

// TestPagingOperations: limit=1 walks a tenant's operations once each,
// oldest first, and never another tenant's; operations started or dropped
// between pages neither repeat nor skip the others.
func TestPagingOperations(t *testing.T) {
	tk := newTenancy(t, nil)
	var acme, all []string
	start := func(tenant string) string {
		op := tk.s.ops.start("image.build", "r", tenant)
		all = append(all, op.ID+"@"+op.Tenant)
		return op.ID + "@" + op.Tenant
	}
	for i := range 9 {
		id := start([]string{"acme", "beta", "acme"}[i%3])
		if strings.HasSuffix(id, "@acme") {
			acme = append(acme, id)
		}
	}
	if got := opIDs(walkPages[apiv1.Operation](tk, "alice", "/v1/operations", 1, nil)); !slices.Equal(got, acme) {
		t.Errorf("alice, limit=1: %v, want %v", got, acme)
	}
	if got := opIDs(walkPages[apiv1.Operation](tk, "ops", "/v1/operations", 4, nil)); !slices.Equal(got, all) {
		t.Errorf("admin, limit=4: %v, want %v", got, all)
	}
	// Beta's operations come last: acme's last page says nothing of them.
	start("beta")
	var page apiv1.List[apiv1.Operation]
	tk.getJSON("alice", "/v1/operations?limit="+strconv.Itoa(len(acme)), &page)
	if len(page.Items) != len(acme) || page.NextCursor != "" {
		t.Errorf("alice's one full page: %d items, next_cursor %q; want %d and none", len(page.Items), page.NextCursor, len(acme))
	}

	// Between pages: one started (after all), one not yet listed dropped.
	var added string
	dropped := acme[4]
	got := opIDs(walkPages[apiv1.Operation](tk, "alice", "/v1/operations", 2, func(page int) {
		if page == 0 {
			tk.s.ops.drop(strings.TrimSuffix(dropped, "@acme"))
			added = start("acme")
		}
	}))
	want := append(slices.DeleteFunc(slices.Clone(acme), func(s string) bool { return s == dropped }), added)
	if !slices.Equal(got, want) {
		t.Errorf("alice, with changes between pages: %v, want %v", got, want)
	}
}

// TestPagingSandboxes: filters combine with paging, and a tenant's pages
// hold its own sandboxes only, oldest first.
func TestPagingSandboxes(t *testing.T) {
	created := time.Now().UTC().Add(time.Minute)
	var acmeA, dead []string
	tk := newTenancy(t, func(c *sandbox.Config) {
		for i := range 12 {
			r := state.SandboxRecord{
				ID: "sb-p" + strconv.Itoa(100+i), Tag: []string{"a-base", "b-base"}[i%2], State: apiv1.StateDead,
				Tenant: []string{"acme", "acme", "beta"}[i%3],
				// Pairs share a creation time: the ID orders them.
				Created: created.Add(time.Duration(i/2) * time.Second),
			}
			if err := c.State.PutSandbox(r); err != nil {
				t.Fatal(err)
			}
			if r.Tenant == "acme" && r.Tag == "a-base" {
				acmeA = append(acmeA, r.ID)
			}
			dead = append(dead, r.ID)
		}
	})
	ids := func(sbs []apiv1.Sandbox) []string {
		var out []string
		for _, sb := range sbs {
			out = append(out, sb.ID)
		}
		return out
	}
	if got := ids(walkPages[apiv1.Sandbox](tk, "alice", "/v1/sandboxes?tag=a-base", 1, nil)); !slices.Equal(got, append([]string{sbA}, acmeA...)) {
		t.Errorf("alice, tag=a-base, limit=1: %v, want %v", got, append([]string{sbA}, acmeA...))
	}
	bobs := walkPages[apiv1.Sandbox](tk, "bob", "/v1/sandboxes?state=dead", 1, nil)
	if len(bobs) != 5 { // sbB and 4 of the 12
		t.Errorf("bob lists %d sandboxes, want 5", len(bobs))
	}
	for _, sb := range bobs {
		if sb.Tenant != "beta" {
			t.Errorf("bob lists %s of tenant %s", sb.ID, sb.Tenant)
		}
	}
	want := append([]string{sbA, sbB, sbOld}, dead...)
	if got := ids(walkPages[apiv1.Sandbox](tk, "ops", "/v1/sandboxes?state=dead", 5, nil)); !slices.Equal(got, want) {
		t.Errorf("admin, state=dead, limit=5: %v, want %v", got, want)
	}
	if got := ids(walkPages[apiv1.Sandbox](tk, "ops", "/v1/sandboxes?state=running", 1, nil)); len(got) != 0 {
		t.Errorf("admin, state=running: %v, want none", got)
	}
}

// TestPagingSnapshots: snapshots page by tag; one added before the cursor
// is not listed, one added after is, and a removed one is simply absent.
func TestPagingSnapshots(t *testing.T) {
	var dataDir string
	tk := newTenancy(t, func(c *sandbox.Config) {
		dataDir = c.DataDir
		for _, tag := range []string{"p-1", "p-2", "p-3", "p-4"} {
			addSnapshot(t, c.DataDir, tag, 16)
		}
	})
	tags := func(snaps []apiv1.Snapshot) []string {
		var out []string
		for _, s := range snaps {
			out = append(out, s.Tag)
		}
		return out
	}
	all := []string{"a-base", "b-base", "legacy", "p-1", "p-2", "p-3", "p-4"}
	if got := tags(walkPages[apiv1.Snapshot](tk, "ops", "/v1/snapshots", 1, nil)); !slices.Equal(got, all) {
		t.Errorf("admin, limit=1: %v, want %v", got, all)
	}
	if got := tags(walkPages[apiv1.Snapshot](tk, "alice", "/v1/snapshots", 1, nil)); !slices.Equal(got, []string{"a-base"}) {
		t.Errorf("alice, limit=1: %v, want [a-base]", got)
	}
	store, err := snapshot.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	got := tags(walkPages[apiv1.Snapshot](tk, "ops", "/v1/snapshots", 2, func(page int) {
		if page == 1 { // after a-base, b-base, legacy, p-1
			addSnapshot(t, dataDir, "c-new", 16) // before the cursor
			addSnapshot(t, dataDir, "z-new", 16)
			if err := store.Remove("p-3"); err != nil {
				t.Fatal(err)
			}
		}
	}))
	if want := []string{"a-base", "b-base", "legacy", "p-1", "p-2", "p-4", "z-new"}; !slices.Equal(got, want) {
		t.Errorf("admin, limit=2, with changes between pages: %v, want %v", got, want)
	}
}

// TestPagingBadQuery: a limit out of range or a cursor the list did not
// give is a 400 that says what to send instead, on every list.
func TestPagingBadQuery(t *testing.T) {
	tk := newTenancy(t, nil)
	var sbPage apiv1.List[apiv1.Sandbox]
	tk.getJSON("ops", "/v1/sandboxes?limit=1", &sbPage)
	if sbPage.NextCursor == "" {
		t.Fatal("3 sandboxes, limit=1: no next_cursor")
	}
	for _, path := range []string{"/v1/sandboxes", "/v1/snapshots", "/v1/images", "/v1/operations", "/v1/tenants"} {
		for _, limit := range []string{"0", "-1", "1001", "ten", "1e3"} {
			a := tk.call("ops", "GET", path+"?limit="+limit, "", nil)
			if a.status != 400 || a.p.Code != "invalid_argument" || !strings.Contains(a.p.Detail, "from 1 to 1000") {
				t.Errorf("%s?limit=%s: %d %s, want 400 naming the range", path, limit, a.status, a.body)
			}
		}
		for _, cursor := range []string{"!!", "bm90IGpzb24", strings.Repeat("A", 2000)} {
			a := tk.call("ops", "GET", path+"?cursor="+cursor, "", nil)
			if a.status != 400 || !strings.Contains(a.p.Detail, "without cursor") {
				t.Errorf("%s?cursor=%.20s: %d %s, want 400 saying to start over", path, cursor, a.status, a.body)
			}
		}
		if a := tk.call("ops", "GET", path+"?limit=1000", "", nil); a.status != 200 || !strings.HasPrefix(string(a.body), `{"items":[`) {
			t.Errorf("%s?limit=1000: %d %s, want the list envelope", path, a.status, a.body)
		}
	}
	// A sandbox cursor is not a snapshot cursor.
	if a := tk.call("ops", "GET", "/v1/snapshots?cursor="+sbPage.NextCursor, "", nil); a.status != 400 {
		t.Errorf("snapshots with a sandbox cursor: %d %s, want 400", a.status, a.body)
	}
}
