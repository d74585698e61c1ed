package sandbox

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// slotEngine is an engine with n build slots and nothing else: build
// admission needs no VMM, network or root.
func slotEngine(n int) *Engine { return &Engine{buildSem: make(chan struct{}, n)} }

// TestTenantBuildQuota: a tenant at its max_builds is refused with the
// quota, its value, its builds and the fix, while another tenant and the
// operator still get slots; a release (any number of times) gives back
// exactly one, and the tenant's count goes with it.
func TestTenantBuildQuota(t *testing.T) {
	e := slotEngine(4)
	one := TenantQuota{MaxBuilds: 1}
	a1, err := e.TryAcquireBuild("build image a1", "acme", one)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.TryAcquireBuild("create snapshot a2", "acme", one)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(),
		"create snapshot a2: tenant \"acme\" quota max_builds=1: 1 image builds or snapshot creations running; wait for them to finish, or ask an admin to raise the quota (`forkd tenant quota acme --max-builds N`)") {
		t.Fatalf("acme's second build: %v", err)
	}
	if u := e.TenantUsage("acme"); u.Builds != 1 {
		t.Errorf("acme's usage: %+v", u)
	}
	b1, err := e.TryAcquireBuild("build image b1", "beta", one)
	if err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	op, err := e.TryAcquireBuild("build image op", "", TenantQuota{})
	if err != nil {
		t.Fatalf("the operator: %v", err)
	}
	a1.Release()
	a1.Release() // idempotent: gives back one slot, not two
	if u := e.TenantUsage("acme"); u.Builds != 0 {
		t.Errorf("acme's usage after release: %+v", u)
	}
	a2, err := e.TryAcquireBuild("create snapshot a2", "acme", one)
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	// 3 of 4 slots held: a double release would have left 2 free.
	if _, err := e.TryAcquireBuild("x", "", TenantQuota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.TryAcquireBuild("y", "", TenantQuota{}); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "4 image builds or snapshot creations already running (forkd serve --max-builds)") {
		t.Fatalf("past the daemon's slots: %v", err)
	}
	for _, s := range []*BuildSlot{a2, b1, op} {
		s.Release()
	}
	if len(e.tenantBuilds) != 0 {
		t.Errorf("tenant counts left: %+v", e.tenantBuilds)
	}
}

// TestBuildFairnessRule: a tenant without max_builds takes at most all
// the daemon's slots but one, so another tenant still gets one; a quota
// of builds overrides the rule; a one-slot daemon lets any tenant take
// its slot; the operator takes every slot.
func TestBuildFairnessRule(t *testing.T) {
	e := slotEngine(3)
	var held []*BuildSlot
	take := func(tenant string, q TenantQuota) error {
		s, err := e.TryAcquireBuild("build image x", tenant, q)
		if err == nil {
			held = append(held, s)
		}
		return err
	}
	releaseAll := func() {
		for _, s := range held {
			s.Release()
		}
		held = nil
	}
	for i := range 2 {
		if err := take("acme", TenantQuota{MaxSandboxes: 5}); err != nil {
			t.Fatalf("acme's build %d: %v", i+1, err)
		}
	}
	err := take("acme", TenantQuota{MaxSandboxes: 5})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(),
		"tenant \"acme\" has no max_builds quota, so it may hold 2 of the daemon's 3 build slots (one is kept for other tenants): 2 image builds or snapshot creations running; wait for them to finish, or ask an admin to set a quota (`forkd tenant quota acme --max-builds N`)") {
		t.Fatalf("acme's third build: %v", err)
	}
	if err := take("beta", TenantQuota{}); err != nil {
		t.Fatalf("the slot kept for other tenants: %v", err)
	}
	releaseAll()

	// A quota of builds is the admin's word: it may take every slot.
	for i := range 3 {
		if err := take("acme", TenantQuota{MaxBuilds: 3}); err != nil {
			t.Fatalf("acme with max_builds=3, build %d: %v", i+1, err)
		}
	}
	releaseAll()

	// The operator is held to the daemon's slots only.
	for i := range 3 {
		if err := take("", TenantQuota{}); err != nil {
			t.Fatalf("operator's build %d: %v", i+1, err)
		}
	}
	releaseAll()

	// One slot: the rule leaves it to whoever comes first.
	e = slotEngine(1)
	if err := take("acme", TenantQuota{}); err != nil {
		t.Fatalf("one-slot daemon: %v", err)
	}
	if err := take("beta", TenantQuota{}); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "--max-builds") {
		t.Fatalf("one-slot daemon, second tenant: %v", err)
	}
	if err := take("acme", TenantQuota{}); !errdefs.IsResourceExhausted(err) || strings.Contains(err.Error(), "kept for other tenants") {
		t.Fatalf("one-slot daemon, acme again: %v, want the daemon's limit", err)
	}
	releaseAll()
	if len(e.tenantBuilds) != 0 || len(e.buildSem) != 0 {
		t.Errorf("left: counts %+v, %d slots", e.tenantBuilds, len(e.buildSem))
	}
}

// TestCreateSnapshotTakesTenantSlot: CreateSnapshot without a slot takes
// one for its Tenant, bound by its Quota, and so is refused for a tenant
// at its max_builds before anything starts (no VMM is needed to see it).
func TestCreateSnapshotTakesTenantSlot(t *testing.T) {
	e, err := New(Config{
		DataDir: t.TempDir(), RunDir: t.TempDir(), Driver: &fakeDriver{},
		NetNSPrefix: "fkb" + snapshot.NewID()[:4] + "-",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	q := TenantQuota{MaxBuilds: 1}
	held, err := e.TryAcquireBuild("build image held", "acme", q)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	_, err = e.CreateSnapshot(context.Background(), CreateSnapshotOptions{
		Tag: "s1", RecipeTOML: "name = 'tiny'\nbase = 'busybox'\n", Tenant: "acme", Quota: q,
	})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), `create snapshot s1: tenant "acme" quota max_builds=1: 1 image builds`) {
		t.Fatalf("CreateSnapshot for acme at its max_builds: %v", err)
	}
	if n := len(e.buildSem); n != 1 {
		t.Errorf("%d slots held, want the test's 1", n)
	}
}
