package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// keepAlive writes SSE comments until stopped, nothing after, and nothing
// at all on an NDJSON stream.
func TestEventWriterKeepAlive(t *testing.T) {
	for _, accept := range []string{sseType, ndjson} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/v1/operations/x/events", nil)
		r.Header.Set("Accept", accept)
		ev := startEvents(rec, r, http.NewResponseController(rec))
		body := func() string {
			ev.mu.Lock()
			defer ev.mu.Unlock()
			return rec.Body.String()
		}
		stop := ev.keepAlive(time.Millisecond)
		if accept == sseType {
			deadline := time.Now().Add(time.Minute)
			for !strings.Contains(body(), ": keep-alive\n\n") {
				if time.Now().After(deadline) {
					t.Fatalf("no keep-alive comment in a minute: %q", body())
				}
				time.Sleep(time.Millisecond)
			}
		}
		stop()
		after := body()
		if err := ev.send("state", map[string]string{"state": "done"}); err != nil {
			t.Fatal(err)
		}
		rest := strings.TrimPrefix(body(), after)
		if strings.Contains(rest, "keep-alive") {
			t.Fatalf("%s: a keep-alive was written after stop: %q", accept, rest)
		}
		if accept == ndjson && strings.Contains(after, "keep-alive") {
			t.Fatalf("an NDJSON stream got a comment: %q", after)
		}
	}
}
