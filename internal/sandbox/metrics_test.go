package sandbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

func TestForkMetrics(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 2)
	m := metrics.New("test")
	e.cfg.Metrics = m
	e.Warm("base")
	waitFor(t, func() bool { return e.PoolSize(e.mustSnap(t, "base").ID) == 2 })
	sbs, err := e.Fork(context.Background(), "base", 3)
	if err != nil {
		t.Fatal(err)
	}
	ag, err := e.Agent(sbs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	ag.Stat(context.Background(), "/etc/hostname")
	body := scrapeText(t, m)
	for _, l := range []string{
		`forkd_fork_ready_seconds_count{pooled="true",tag="base"} 2`,
		`forkd_fork_ready_seconds_count{pooled="false",tag="base"} 1`,
		`forkd_agent_rpc_duration_seconds_count{op="GET /v1/files/stat"} 1`,
	} {
		if !strings.Contains(body, l) {
			t.Errorf("metrics lack %s", l)
		}
	}
	// Two VMMs restored ahead in the pool and one on the fork's path; the
	// refill after the fork restores more in the background.
	m2 := regexp.MustCompile(`(?m)^forkd_vmm_phase_seconds_count\{phase="restore"\} (\d+)$`).FindStringSubmatch(body)
	if m2 == nil {
		t.Fatalf("metrics lack forkd_vmm_phase_seconds_count{phase=\"restore\"}")
	}
	if n, _ := strconv.Atoi(m2[1]); n < 3 {
		t.Errorf("%d restores observed, want at least 3", n)
	}
}

// TestBranchTagsDoNotGrowSeries: SDKs name every branch afresh
// (<tag>-br-<random>); forks of many branches stay in one series per
// template and pooling, under metrics.BranchTag.
func TestBranchTagsDoNotGrowSeries(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	m := metrics.New("test")
	e.cfg.Metrics = m
	ctx := context.Background()
	src, err := e.Fork(ctx, "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	const branches = 25
	for i := range branches {
		tag := fmt.Sprintf("base-br-%08x", rand.Uint32())
		// Full branches: the fake driver's layers do not assemble.
		if _, err := e.Branch(ctx, src[0].ID, BranchOptions{Tag: tag, Mode: BranchFull}); err != nil {
			t.Fatalf("branch %d: %v", i, err)
		}
		sbs, err := e.Fork(ctx, tag, 1)
		if err != nil {
			t.Fatalf("fork of branch %s: %v", tag, err)
		}
		if _, err := e.Kill(ctx, []string{sbs[0].ID}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Fork(ctx, "no-such-tag", 1); !errdefs.IsNotFound(err) {
		t.Fatalf("fork of a missing tag: %v", err)
	}
	body := scrapeText(t, m)
	for _, l := range []string{
		`forkd_fork_ready_seconds_count{pooled="false",tag="base"} 1`,
		fmt.Sprintf(`forkd_fork_ready_seconds_count{pooled="false",tag="_branch"} %d`, branches),
		fmt.Sprintf(`forkd_fork_requests_total{result="ok"} %d`, branches+1),
		`forkd_fork_requests_total{result="not_found"} 1`,
	} {
		if !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("metrics lack %s", l)
		}
	}
	if n := strings.Count(body, "\nforkd_fork_ready_seconds_count{"); n != 2 {
		t.Errorf("%d fork-ready series after forks of %d branches, want 2 (base, _branch)", n, branches)
	}
}

// TestGuestMemory: what /metrics reports as committed guest memory is
// what admission counts: running sandboxes, released when they go.
func TestGuestMemory(t *testing.T) {
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.MaxGuestMemoryMiB = 1024 })
	ctx := context.Background()
	if used, limit := e.GuestMemory(); used != 0 || limit != 1024 {
		t.Fatalf("idle engine: %d MiB committed, limit %d", used, limit)
	}
	sbs, err := e.Fork(ctx, "base", 2)
	if err != nil {
		t.Fatal(err)
	}
	snap := e.mustSnap(t, "base")
	if used, _ := e.GuestMemory(); used != 2*int64(snap.MemoryMiB) {
		t.Errorf("2 children of %d MiB: %d MiB committed", snap.MemoryMiB, used)
	}
	if _, err := e.Kill(ctx, []string{sbs[0].ID, sbs[1].ID}); err != nil {
		t.Fatal(err)
	}
	if used, _ := e.GuestMemory(); used != 0 {
		t.Errorf("all killed: %d MiB committed", used)
	}
}

func scrapeText(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d", rec.Code)
	}
	return rec.Body.String()
}

// TestPoolRefillFailuresAreCounted: a refill whose VMM does not restore
// is counted under its error class, and the fork that then finds the pool
// empty is counted as pooled="false".
func TestPoolRefillFailuresAreCounted(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{failRestore: 1}, 1)
	m := metrics.New("test")
	e.cfg.Metrics = m
	if err := e.Warm("base"); err != nil {
		t.Fatal(err)
	}
	const want = `forkd_pool_refill_failures_total{code="internal"} 1`
	waitFor(t, func() bool { return strings.Contains(scrapeText(t, m), "\n"+want+"\n") })
	if _, err := e.Fork(context.Background(), "base", 1); err != nil {
		t.Fatal(err)
	}
	if body := scrapeText(t, m); !strings.Contains(body, "\n"+`forkd_fork_ready_seconds_count{pooled="false",tag="base"} 1`+"\n") {
		t.Errorf("the fork after a failed refill was not counted as unpooled:\n%s", body)
	}
}

// TestMetricsState: the state /metrics reads at scrape time, with pools
// reported by tag label (every branch under metrics.BranchTag, an empty
// pool as 0) and the committed guest memory.
func TestMetricsState(t *testing.T) {
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 1, func(c *Config) { c.MaxGuestMemoryMiB = 4096 })
	ctx := context.Background()
	sbs, err := e.Fork(ctx, "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"base-br-1", "base-br-2"} {
		if _, err := e.Branch(ctx, sbs[0].ID, BranchOptions{Tag: tag, Mode: BranchFull}); err != nil {
			t.Fatal(err)
		}
	}
	// Each snapshot's pool refills to 1 (base's after the fork, each
	// branch's once committed).
	waitFor(t, func() bool {
		st := e.MetricsState()
		return st.PooledVMMs["base"] == 1 && st.PooledVMMs[metrics.BranchTag] == 2
	})
	st := e.MetricsState()
	if len(st.PooledVMMs) != 2 || st.PoolSize != 1 || st.Snapshots != 3 || st.SandboxesByState["running"] != 1 {
		t.Errorf("state: %+v", st)
	}
	if st.SnapshotBytes <= 0 {
		t.Errorf("snapshot bytes %d", st.SnapshotBytes)
	}
	mib := int64(e.mustSnap(t, "base").MemoryMiB)
	// One running sandbox and three pooled VMMs, all of base's size.
	if st.GuestMemoryBytes != 4*mib<<20 || st.GuestMemoryLimitBytes != 4096<<20 {
		t.Errorf("guest memory %d of %d bytes, want %d of %d", st.GuestMemoryBytes, st.GuestMemoryLimitBytes, 4*mib<<20, int64(4096)<<20)
	}
	e.DropPool(ctx, e.mustSnap(t, "base").ID)
	if n, ok := e.MetricsState().PooledVMMs["base"]; !ok || n != 0 {
		t.Errorf("a dropped pool: %d, %v; want a 0", n, ok)
	}
}
