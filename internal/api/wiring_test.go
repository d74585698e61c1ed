package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// TestAuthMetricsOpenAPIWired checks the Handler with tokens and metrics on
// a TCP listener: 401 problems carry the request id, healthz is open, and
// requests are recorded by route pattern.
func TestAuthMetricsOpenAPIWired(t *testing.T) {
	tokens, tok := tokenStore(t, "ci")
	m := metrics.New("test")
	srv := httptest.NewServer((&Server{Metrics: m, Tokens: tokens}).Handler())
	defer srv.Close()
	get := func(path, token string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/v1/version", "")
	var p apiv1.Problem
	json.Unmarshal([]byte(body), &p)
	if resp.StatusCode != 401 || resp.Header.Get("X-Request-Id") == "" || p.RequestID != resp.Header.Get("X-Request-Id") || p.Code != "unauthenticated" {
		t.Errorf("without a token: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if resp, _ := get("/v1/healthz", ""); resp.StatusCode != 200 {
		t.Errorf("healthz without a token: %d", resp.StatusCode)
	}
	if resp, body := get("/v1/openapi.json", tok); resp.StatusCode != 200 || !strings.HasPrefix(body, `{"openapi":"3.1.0"`) {
		t.Errorf("openapi.json: %d", resp.StatusCode)
	}
	_, body = get("/metrics", tok)
	for _, l := range []string{
		`forkd_http_request_duration_seconds_count{code="401",method="GET",route="/v1/version"} 1`,
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/healthz"} 1`,
		`forkd_http_request_duration_seconds_count{code="200",method="GET",route="/v1/openapi.json"} 1`,
	} {
		if !strings.Contains(body, l) {
			t.Errorf("metrics lack %s", l)
		}
	}
}
