package sandbox

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	for _, l := range []string{
		`forkd_fork_ready_seconds_count{pooled="true",tag="base"} 2`,
		`forkd_fork_ready_seconds_count{pooled="false",tag="base"} 1`,
		`forkd_vmm_phase_seconds_count{phase="restore"} 3`,
		`forkd_agent_rpc_duration_seconds_count{op="GET /v1/files/stat"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), l) {
			t.Errorf("metrics lack %s", l)
		}
	}
}
