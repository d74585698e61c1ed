package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// onlyReader hides a body's length, so the client sends it chunked.
type onlyReader struct{ io.Reader }

// TestSignalEmptyBodyIsSIGKILL: an empty signal request means SIGKILL
// whether it says Content-Length: 0 or comes chunked; it is decoded only
// when it has bytes. With no such sandbox, the answer is its 404, not a
// 400 about the body.
func TestSignalEmptyBodyIsSIGKILL(t *testing.T) {
	srv := httptest.NewServer((&Server{Engine: nopEngine(t, "", "fksi", nil)}).Handler())
	defer srv.Close()
	url := srv.URL + "/v1/sandboxes/sb-none/processes/7/signal"
	for _, c := range []struct {
		name string
		body io.Reader
		ct   string
		want int
		code string
	}{
		{"no body", nil, "", 404, "not_found"},
		{"empty, chunked", onlyReader{strings.NewReader("")}, "", 404, "not_found"},
		{"JSON, chunked", onlyReader{strings.NewReader(`{"signal":"TERM"}`)}, "application/json", 404, "not_found"},
		{"JSON without a content type", onlyReader{strings.NewReader(`{"signal":"TERM"}`)}, "", 415, "invalid_argument"},
		{"unknown field", strings.NewReader(`{"sig":"TERM"}`), "application/json", 400, "invalid_argument"},
	} {
		req, _ := http.NewRequest(http.MethodPost, url, c.body)
		if c.ct != "" {
			req.Header.Set("Content-Type", c.ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p apiv1.Problem
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != c.want || p.Code != c.code {
			t.Errorf("%s: %d %s (%s), want %d %s", c.name, resp.StatusCode, p.Code, p.Detail, c.want, c.code)
		}
	}
}
