package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestBuildsRefusedBeforeAnswering: with every build slot taken, POST
// /v1/images and POST /v1/snapshots answer 429 with Retry-After (no 202
// operation, no 200 stream), and bad snapshot arguments are a plain 400
// whatever the slots. No VMM is needed: nothing gets that far.
func TestBuildsRefusedBeforeAnswering(t *testing.T) {
	e := nopEngine(t, "", "fkbu", func(c *sandbox.Config) { c.MaxConcurrentBuilds = 1 })
	srv := httptest.NewServer((&Server{Engine: e}).Handler())
	defer srv.Close()
	post := func(path, body string) (*http.Response, apiv1.Problem) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p apiv1.Problem
		json.NewDecoder(resp.Body).Decode(&p)
		return resp, p
	}
	const recipe = `"recipe_toml":"name = 'tiny'\nbase = 'busybox'\n"`

	slot, err := e.TryAcquireBuild("held by the test", "", sandbox.TenantQuota{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/images", `{` + recipe + `}`},
		{"/v1/snapshots", `{"tag":"s1",` + recipe + `}`},
	} {
		resp, p := post(c.path, c.body)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			p.Code != "resource_exhausted" || !strings.Contains(p.Detail, "--max-builds") {
			t.Errorf("POST %s with no build slot free: %d Retry-After %q %+v", c.path, resp.StatusCode, resp.Header.Get("Retry-After"), p)
		}
	}
	resp, err := http.Get(srv.URL + "/v1/operations")
	if err != nil {
		t.Fatal(err)
	}
	var ops apiv1.List[apiv1.Operation]
	if err := json.NewDecoder(resp.Body).Decode(&ops); err != nil {
		t.Fatalf("GET /v1/operations: %v", err)
	}
	resp.Body.Close()
	if len(ops.Items) != 0 {
		t.Errorf("a refused build left operations: %+v", ops.Items)
	}

	// Arguments are checked before the slot and before any stream.
	slot.Release()
	for body, says := range map[string]string{
		`{"tag":"s2",` + recipe + `,"memory_mib":1}`: "memory 1 MiB out of range",
		`{"tag":"s2",` + recipe + `,"vcpus":100}`:    "vcpus 100 out of range",
		`{"tag":"s2",` + recipe + `,"warm":"x = 1"}`: "[python] section",
		`{"tag":"Bad Tag",` + recipe + `}`:           snapshot.TagRule,
	} {
		resp, p := post("/v1/snapshots", body)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Detail, says) {
			t.Errorf("POST /v1/snapshots %s: %d %s %+v, want 400 saying %q", body, resp.StatusCode, resp.Header.Get("Content-Type"), p, says)
		}
	}
	// None of them kept the slot.
	s, err := e.TryAcquireBuild("after the refusals", "", sandbox.TenantQuota{})
	if err != nil {
		t.Fatalf("build slot leaked by a refused request: %v", err)
	}
	s.Release()
}
