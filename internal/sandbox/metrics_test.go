package sandbox

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
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
