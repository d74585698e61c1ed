package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestMetricsEndpoint: the daemon's /metrics, as Prometheus scrapes it,
// has what packaging/monitoring's alerts and dashboard read (the fork
// counter, pools by tag, the data directory's space) and gives a branch
// named the way SDKs name them no series of its own.
func TestMetricsEndpoint(t *testing.T) {
	c := newCLI(t)
	tag := "it-metrics-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", "--cascade", tag)
	var fr apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "-n", "1", "--json")), &fr)
	if len(fr.Sandboxes) != 1 {
		t.Fatalf("fork: %+v", fr)
	}
	btag := tag + "-br-" + snapshot.NewID()[:8]
	c.ok("branch", fr.Sandboxes[0].ID, "--tag", btag)
	c.ok("fork", "--tag", btag, "-n", "1")

	resp, err := unixHTTP(filepath.Join(c.runDir, "forkd.sock")).Get("http://forkd/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	text := string(body)
	for _, re := range []string{
		`(?m)^forkd_fork_requests_total\{result="ok"\} [2-9]`,
		`(?m)^forkd_fork_ready_seconds_count\{pooled="(true|false)",tag="` + regexp.QuoteMeta(tag) + `"\} 1$`,
		`(?m)^forkd_fork_ready_seconds_count\{pooled="(true|false)",tag="_branch"\} 1$`,
		`(?m)^forkd_pooled_vmms\{tag="` + regexp.QuoteMeta(tag) + `"\} \d+$`,
		`(?m)^forkd_pooled_vmms\{tag="_branch"\} \d+$`,
		`(?m)^forkd_filesystem_size_bytes\{dir="data"\} [1-9]`,
		`(?m)^forkd_filesystem_available_bytes\{dir="run"\} `,
		`(?m)^forkd_guest_memory_committed_bytes [1-9]`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("/metrics has no line matching %s", re)
		}
	}
	if strings.Contains(text, btag) {
		t.Errorf("/metrics names the branch tag %s: a series per SDK branch", btag)
	}
}
