package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// TestBuildImageFromArguments: from is exclusive with recipe and
// recipe_toml, insecure_registry needs from, and a bad reference is a 400
// before any operation starts.
func TestBuildImageFromArguments(t *testing.T) {
	e := nopEngine(t, "", "fkbi", nil)
	srv := httptest.NewServer((&Server{Engine: e}).Handler())
	defer srv.Close()
	for body, says := range map[string]string{
		`{"from":"127.0.0.1:5000/a:v1","recipe":"minimal"}`:                             "not several",
		`{"from":"127.0.0.1:5000/a:v1","recipe_toml":"name = 'x'\nbase = 'busybox'\n"}`: "not several",
		`{"recipe":"minimal","insecure_registry":true}`:                                 "without from",
		`{"from":"not a reference"}`:                                                    "not an image reference",
	} {
		resp, err := http.Post(srv.URL+"/v1/images", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var p apiv1.Problem
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(p.Detail, says) {
			t.Errorf("POST /v1/images %s: %d %+v, want 400 saying %q", body, resp.StatusCode, p, says)
		}
	}
}
