package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/metrics"
)

// Instrument records every request's duration and status in m
// (forkd_http_request_duration_seconds), labelled with the ServeMux pattern
// that routes it, never the raw path, so the label set stays bounded.
//
// mux is the router whose patterns name the routes; next is the handler
// chain to run, ending in mux (next may be mux itself, or mux behind
// middleware such as auth.Middleware that derives a new request, which is
// why the route is looked up in mux rather than read back from r.Pattern).
// With a nil mux the route is r.Pattern after next returns, which works
// only when next passes its request to the mux unchanged. Requests no
// pattern matches are labelled "unmatched"; the mux's own redirects (path
// cleaning, trailing slash) carry the pattern they redirect to.
//
// The ResponseWriter given to next keeps http.Flusher and, through Unwrap,
// everything http.ResponseController reaches (full duplex, deadlines,
// hijacking). A nil m returns next unchanged.
func Instrument(m *metrics.Metrics, mux *http.ServeMux, next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var pattern string
		if mux != nil {
			_, pattern = mux.Handler(r)
		}
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		completed := false
		defer func() {
			status := sw.status
			if status == 0 {
				status = http.StatusOK // what net/http sends for a handler that wrote nothing
				if !completed {
					status = http.StatusInternalServerError // it panicked before answering
				}
			}
			if pattern == "" {
				pattern = r.Pattern
			}
			if r.Method == http.MethodConnect {
				pattern = "" // ServeMux reports a CONNECT redirect's raw path as its pattern
			}
			m.ObserveRequest(routeLabel(pattern), r.Method, status, time.Since(start))
		}()
		next.ServeHTTP(sw, r)
		completed = true
	})
}

// routeLabel turns a pattern ("GET /v1/sandboxes/{id}") into the route
// label ("/v1/sandboxes/{id}"); the method is a label of its own.
func routeLabel(pattern string) string {
	if pattern == "" {
		return "unmatched"
	}
	if i := strings.IndexByte(pattern, ' '); i >= 0 {
		pattern = strings.TrimLeft(pattern[i+1:], " \t")
	}
	return pattern
}

// statusWriter remembers the status a handler sent.
type statusWriter struct {
	http.ResponseWriter
	status int // 0 until the final (non-1xx) header is sent
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher for handlers that type-assert it.
func (w *statusWriter) Flush() { w.FlushError() }

// FlushError is what http.ResponseController.Flush calls first.
func (w *statusWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// maxRequestIDLen bounds a client's X-Request-Id.
const maxRequestIDLen = 128

// validRequestID reports whether a client's X-Request-Id may be used as
// the request's id: 1-128 characters of [A-Za-z0-9._:-]. Anything else
// (empty, long, spaces, quotes, control or non-ASCII characters) is
// replaced by a generated id: the id goes into logs, audit records and
// response headers, where such characters could forge or break entries.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}
