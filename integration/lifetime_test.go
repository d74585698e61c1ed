package integration

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestSandboxLifetime, through the CLI and a real daemon: a fork that
// names no timeout gets the daemon's default (an hour), --timeout 0 gets
// none; `forkd sandbox timeout` shortens a running sandbox's life, which
// then ends on its own, is audited as expired, counted in the metrics
// and streamed on GET /v1/events; GET /v1/info states the default.
func TestSandboxLifetime(t *testing.T) {
	c := newCLI(t)
	tag := "it-life-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	hc := unixHTTP(filepath.Join(c.runDir, "forkd.sock"))

	var info apiv1.Info
	resp, err := hc.Get("http://forkd/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if info.Limits.DefaultTimeoutSeconds != 3600 || info.Caller.Role != "admin" || !slices.Contains(info.Features, "lifetimes") || !slices.Contains(info.Features, "events") {
		t.Fatalf("GET /v1/info: %+v", info)
	}

	// The stream answers once subscribed: nothing after this is missed.
	req, _ := http.NewRequest(http.MethodGet, "http://forkd/v1/events?type=sandbox.", nil)
	stream, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	events := make(chan apiv1.Event, 64)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stream.Body)
		for sc.Scan() {
			var ev apiv1.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
	}()

	fork := func(args ...string) apiv1.Sandbox {
		t.Helper()
		var fr apiv1.ForkResponse
		if err := json.Unmarshal([]byte(c.ok(append([]string{"fork", "--tag", tag, "--json"}, args...)...)), &fr); err != nil || len(fr.Sandboxes) != 1 {
			t.Fatalf("fork %v: %+v, %v", args, fr, err)
		}
		return fr.Sandboxes[0]
	}
	def := fork()
	if def.ExpiresAt == nil || def.ExpiresAt.Sub(def.Created).Round(time.Minute) != time.Hour {
		t.Fatalf("fork without --timeout: created %v, expires %v; want the daemon's default, an hour later", def.Created, def.ExpiresAt)
	}
	never := fork("--timeout", "0")
	if never.ExpiresAt != nil {
		t.Fatalf("fork --timeout 0 expires at %v", never.ExpiresAt)
	}

	// Give the unlimited one a limit, then end the default one soon.
	out := c.ok("sandbox", "timeout", never.ID, "3h")
	if !strings.Contains(out, "ends at") {
		t.Fatalf("sandbox timeout 3h: %q", out)
	}
	var sb apiv1.Sandbox
	json.Unmarshal([]byte(c.ok("sandbox", "info", never.ID, "--json")), &sb)
	if sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 2*time.Hour {
		t.Fatalf("after sandbox timeout 3h: expires at %v", sb.ExpiresAt)
	}
	if _, errOut, code := c.run("sandbox", "timeout", never.ID, "soon"); code == 0 || !strings.Contains(errOut, "want a duration") {
		t.Fatalf("sandbox timeout with a bad duration: exit %d, %s", code, errOut)
	}
	c.ok("sandbox", "timeout", def.ID, "2s")
	waitFor(t, 2*time.Minute, "the shortened sandbox to expire", func() bool {
		for _, s := range c.sandboxes() {
			if s.ID == def.ID {
				return false
			}
		}
		return true
	})
	if _, errOut, code := c.run("sandbox", "timeout", def.ID, "1h"); code == 0 || !strings.Contains(errOut, "no sandbox") {
		t.Fatalf("extending an expired sandbox: exit %d, %s", code, errOut)
	}

	var recs []struct {
		Action  string   `json:"action"`
		Targets []string `json:"targets"`
		Outcome string   `json:"outcome"`
	}
	if err := json.Unmarshal([]byte(c.ok("audit", "tail", "-n", "200", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, r := range recs {
		switch {
		case r.Action == "PATCH /v1/sandboxes/{id}" && r.Outcome == "ok" && len(r.Targets) > 1 && r.Targets[0] == def.ID && r.Targets[1] == "timeout=2s":
			found["patch"] = true
		case r.Action == "sandbox.expired" && len(r.Targets) > 0 && r.Targets[0] == def.ID:
			found["expired"] = true
		}
	}
	for _, k := range []string{"patch", "expired"} {
		if !found[k] {
			t.Errorf("no audit record for %s in %+v", k, recs)
		}
	}

	resp, err = hc.Get("http://forkd/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, l := range []string{`forkd_sandbox_events_total{event="created"} 2`, `forkd_sandbox_events_total{event="expired"} 1`} {
		if !strings.Contains(string(body), l+"\n") {
			t.Errorf("metrics lack %s", l)
		}
	}

	c.ok("kill", never.ID)
	want := []string{"sandbox.created " + def.ID, "sandbox.created " + never.ID, "sandbox.expired " + def.ID, "sandbox.killed " + never.ID}
	var got []string
	deadline := time.After(2 * time.Minute)
	for len(got) < len(want) {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("event stream ended after %v", got)
			}
			got = append(got, ev.Type+" "+ev.Sandbox)
		case <-deadline:
			t.Fatalf("events after 2 minutes: %v, want %v", got, want)
		}
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("events %v, want %v", got, want)
	}
}
