package metrics

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// scrape serves /metrics once and returns the text exposition.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape: content type %q", ct)
	}
	return rec.Body.String()
}

func wantLines(t *testing.T, body string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("scrape lacks line %q", l)
		}
	}
}

func TestBuildInfoAndRuntimeCollectors(t *testing.T) {
	m := New("1.2.3")
	body := scrape(t, m)
	wantLines(t, body, fmt.Sprintf(`forkd_build_info{go_version="%s",version="1.2.3"} 1`, runtime.Version()))
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(body, "\n"+name+" ") {
			t.Errorf("scrape lacks %s", name)
		}
	}
	// Nothing observed yet: vectors have no series, state gauges are absent.
	for _, name := range []string{"forkd_fork_ready_seconds", "forkd_sandboxes", "forkd_http_request_duration_seconds"} {
		if strings.Contains(body, name+"_bucket") || strings.Contains(body, name+"{") {
			t.Errorf("%s has series before anything was observed", name)
		}
	}
}

func TestHistograms(t *testing.T) {
	m := New("dev")
	m.ObserveForkReady("py", true, 30*time.Millisecond)
	m.ObserveForkReady("py", true, 70*time.Millisecond)
	m.ObserveForkReady("py", false, 2*time.Second)
	m.ObserveVMMStart(PhaseRestore, 40*time.Millisecond)
	m.ObserveVMMStart(PhasePrepare, 150*time.Millisecond)
	m.ObserveBranch("live", 3*time.Millisecond, 4096)
	m.ObserveAgentRPC("stat", 2*time.Millisecond, nil)
	m.ObserveAgentRPC("stat", 4*time.Millisecond, fmt.Errorf("agent: stat: %w", errdefs.ErrNotFound))
	m.ObserveAgentRPC("exec", 4*time.Millisecond, errors.New("boom"))
	m.ObserveRequest("/v1/sandboxes", http.MethodPost, 201, 80*time.Millisecond)

	body := scrape(t, m)
	wantLines(t, body,
		`forkd_fork_ready_seconds_count{pooled="true",tag="py"} 2`,
		`forkd_fork_ready_seconds_sum{pooled="true",tag="py"} 0.1`,
		`forkd_fork_ready_seconds_bucket{pooled="true",tag="py",le="0.025"} 0`,
		`forkd_fork_ready_seconds_bucket{pooled="true",tag="py",le="0.05"} 1`,
		`forkd_fork_ready_seconds_bucket{pooled="true",tag="py",le="0.1"} 2`,
		`forkd_fork_ready_seconds_bucket{pooled="false",tag="py",le="1"} 0`,
		`forkd_fork_ready_seconds_bucket{pooled="false",tag="py",le="2.5"} 1`,
		`forkd_fork_ready_seconds_bucket{pooled="false",tag="py",le="+Inf"} 1`,
		`forkd_vmm_phase_seconds_count{phase="restore"} 1`,
		`forkd_vmm_phase_seconds_count{phase="prepare"} 1`,
		`forkd_branch_pause_seconds_bucket{mode="live",le="0.005"} 1`,
		`forkd_branch_written_bytes_total{mode="live"} 4096`,
		`forkd_agent_rpc_duration_seconds_count{op="stat"} 2`,
		`forkd_agent_rpc_errors_total{code="not_found",op="stat"} 1`,
		`forkd_agent_rpc_errors_total{code="internal",op="exec"} 1`,
		`forkd_http_request_duration_seconds_count{code="201",method="POST",route="/v1/sandboxes"} 1`,
	)
	if got := testutil.CollectAndCount(m.agentRPCErrors); got != 2 {
		t.Errorf("agent error series = %d, want 2 (a successful call is no error)", got)
	}
	// Histogram bounds are the documented ones.
	for _, b := range LatencyBuckets {
		if !strings.Contains(body, fmt.Sprintf(`forkd_vmm_phase_seconds_bucket{phase="restore",le="%g"}`, b)) {
			t.Errorf("bucket %g missing", b)
		}
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP forkd_agent_rpc_errors_total Failed host-to-agent calls, by operation and error class.
# TYPE forkd_agent_rpc_errors_total counter
forkd_agent_rpc_errors_total{code="internal",op="exec"} 1
forkd_agent_rpc_errors_total{code="not_found",op="stat"} 1
`), "forkd_agent_rpc_errors_total"); err != nil {
		t.Error(err)
	}
}

func TestStateIsReadAtScrapeTime(t *testing.T) {
	m := New("dev")
	var mu sync.Mutex
	st := State{
		SandboxesByState: map[string]int{"running": 3}, PooledVMMs: map[string]int{"py": 2, BranchTag: 1}, PoolSize: 2,
		Snapshots: 1, SnapshotBytes: 1 << 30, GuestMemoryBytes: 3 << 30, GuestMemoryLimitBytes: 36 << 30,
	}
	calls := 0
	m.SetStateFunc(func() State {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return st
	})
	wantLines(t, scrape(t, m),
		`forkd_sandboxes{state="running"} 3`,
		`forkd_sandboxes{state="dead"} 0`,
		`forkd_sandboxes{state="stopped"} 0`,
		`forkd_pooled_vmms{tag="py"} 2`,
		`forkd_pooled_vmms{tag="_branch"} 1`,
		`forkd_pool_size 2`,
		`forkd_snapshots 1`,
		`forkd_snapshot_bytes 1.073741824e+09`,
		`forkd_guest_memory_committed_bytes 3.221225472e+09`,
		`forkd_guest_memory_limit_bytes 3.8654705664e+10`,
	)
	mu.Lock()
	st = State{SandboxesByState: map[string]int{"dead": 1}, PooledVMMs: map[string]int{"py": 0}}
	mu.Unlock()
	body := scrape(t, m)
	wantLines(t, body,
		`forkd_sandboxes{state="running"} 0`,
		`forkd_sandboxes{state="dead"} 1`,
		`forkd_pooled_vmms{tag="py"} 0`,
		`forkd_snapshots 0`,
	)
	if calls != 2 {
		t.Errorf("state func called %d times for 2 scrapes", calls)
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP forkd_pooled_vmms Pre-started VMM processes ready in the pools, by tag (a template's, or _branch for all branches).
# TYPE forkd_pooled_vmms gauge
forkd_pooled_vmms{tag="py"} 0
`), "forkd_pooled_vmms"); err != nil {
		t.Error(err)
	}
	m.SetStateFunc(nil)
	if strings.Contains(scrape(t, m), "forkd_pooled_vmms") {
		t.Error("state gauges still reported after SetStateFunc(nil)")
	}
}

func TestRequestLabelsAreBounded(t *testing.T) {
	m := New("dev")
	m.ObserveRequest("/v1/x", "BREW", 404, time.Millisecond)
	for i := range MaxRoutes + 50 {
		m.ObserveRequest(fmt.Sprintf("/r%d", i), http.MethodGet, 200, time.Millisecond)
	}
	m.ObserveRequest("/r0", http.MethodGet, 200, time.Millisecond) // known route keeps its label
	body := scrape(t, m)
	wantLines(t, body,
		`forkd_http_request_duration_seconds_count{code="404",method="other",route="/v1/x"} 1`,
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="/r0"} 2`,
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="other"} 51`,
	)
	if n := testutil.CollectAndCount(m.requests); n != MaxRoutes+1 {
		t.Errorf("%d request series, want %d", n, MaxRoutes+1)
	}
}

func TestAgentOpsAndTagsAreBounded(t *testing.T) {
	m := New("dev")
	for i := range MaxOps + 10 {
		m.ObserveAgentRPC(fmt.Sprintf("stat /tmp/f%d", i), time.Millisecond, errors.New("x"))
	}
	for i := range MaxTags + 10 {
		m.ObserveForkReady(fmt.Sprintf("t%d", i), false, time.Millisecond)
	}
	if n := testutil.CollectAndCount(m.agentRPC); n != MaxOps+1 {
		t.Errorf("%d agent op series, want %d", n, MaxOps+1)
	}
	if n := testutil.CollectAndCount(m.agentRPCErrors); n != MaxOps+1 {
		t.Errorf("%d agent error series, want %d", n, MaxOps+1)
	}
	if n := testutil.CollectAndCount(m.forkReady); n != MaxTags+1 {
		t.Errorf("%d fork-ready series, want %d", n, MaxTags+1)
	}
	wantLines(t, scrape(t, m), `forkd_agent_rpc_errors_total{code="internal",op="other"} 10`)
}

func TestConcurrentUse(t *testing.T) {
	m := New("dev")
	m.SetStateFunc(func() State { return State{PoolSize: 1} })
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				m.ObserveForkReady("t", j%2 == 0, time.Millisecond)
				m.ObserveRequest(fmt.Sprintf("/r%d", j%5), http.MethodGet, 200, time.Millisecond)
				m.ObserveAgentRPC("exec", time.Millisecond, nil)
				if j%25 == 0 {
					m.SetStateFunc(func() State { return State{PoolSize: i} })
					rec := httptest.NewRecorder()
					m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
					if rec.Code != http.StatusOK {
						t.Errorf("concurrent scrape: status %d", rec.Code)
					}
				}
			}
		}()
	}
	wg.Wait()
	wantLines(t, scrape(t, m), `forkd_fork_ready_seconds_count{pooled="true",tag="t"} 400`,
		`forkd_agent_rpc_duration_seconds_count{op="exec"} 800`)
}

func TestNilMetricsIsANoOp(t *testing.T) {
	var m *Metrics
	m.ObserveForkReady("t", true, time.Millisecond)
	m.ObserveVMMStart(PhaseBoot, time.Second)
	m.ObserveBranch("x", time.Millisecond, 1)
	m.ObserveAgentRPC("exec", time.Millisecond, errors.New("x"))
	m.ObserveRequest("/", "GET", 200, time.Millisecond)
	m.SetStateFunc(func() State { return State{} })
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("nil Metrics handler: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}
