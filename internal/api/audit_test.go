package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// flakyAnchors is an audit.AnchorStore whose writes fail on demand: the
// simplest way to make audit writes fail (the record is written, its
// anchor is not, and the log then refuses records until it is).
type flakyAnchors struct {
	mu   sync.Mutex
	a    audit.Anchor
	fail error
}

func (f *flakyAnchors) AuditAnchor() (audit.Anchor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.a, nil
}

func (f *flakyAnchors) PutAuditAnchor(a audit.Anchor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.a = a
	return nil
}

func (f *flakyAnchors) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func openAudit(t *testing.T, anchors audit.AnchorStore) (*audit.Log, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "audit")
	l, err := audit.Open(dir, audit.Options{Anchor: anchors})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, dir
}

func tailAll(t *testing.T, dir string) []audit.Record {
	t.Helper()
	recs, err := audit.Tail(dir, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// badFork is a mutating request that needs no engine: the body is
// refused before the engine is asked.
func badFork(h http.Handler, id string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", strings.NewReader(`{"tag":`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Request-Id", id)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// tokenStore opens an empty token store in a temporary dir and creates
// one admin token named name; it returns the store and the token's plaintext.
func tokenStore(t *testing.T, name string) (*auth.Tokens, string) {
	t.Helper()
	tokens, err := auth.Open(filepath.Join(t.TempDir(), auth.StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Create(name, auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	return tokens, tok
}

// Requests refused by auth are recorded, with no token name and the
// peer; reads are not.
func TestAuditRecordsUnauthenticated(t *testing.T) {
	tokens, tok := tokenStore(t, "ci")
	l, dir := openAudit(t, nil)
	srv := httptest.NewUnstartedServer((&Server{Tokens: tokens, Audit: l}).Handler())
	srv.Config.ConnContext = PeerContext
	srv.Start()
	defer srv.Close()
	send := func(method, path, token string) int {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"ids":["sb-1"]}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(http.MethodPost, "/v1/sandboxes/kill", "wrong"); code != 401 {
		t.Fatalf("bad token: %d", code)
	}
	if code := send(http.MethodDelete, "/v1/sandboxes/sb-9", ""); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	if code := send(http.MethodGet, "/v1/sandboxes", ""); code != 401 {
		t.Fatalf("read without token: %d", code)
	}
	if code := send(http.MethodPut, "/v1/sandboxes", tok); code != 405 {
		t.Fatalf("wrong method with a token: %d", code)
	}
	recs := tailAll(t, dir)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3 (reads are not audited): %+v", len(recs), recs)
	}
	host, _, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	for i, want := range []struct{ action, target string }{
		{"POST /v1/sandboxes/kill", ""},
		{"DELETE /v1/sandboxes/{id}", "sb-9"},
	} {
		r := recs[i]
		if r.Outcome != "unauthenticated" || r.Token != "" || !strings.HasPrefix(r.Peer, host+":") || r.Action != want.action ||
			r.RequestID == "" || !strings.Contains(r.Error, "HTTP 401") || (want.target != "" && (len(r.Targets) != 1 || r.Targets[0] != want.target)) {
			t.Errorf("record %d: %+v", i, r)
		}
	}
	if r := recs[2]; r.Token != "ci" || r.Outcome != "invalid_argument" || r.Action != "PUT /v1/sandboxes" {
		t.Errorf("authenticated request: %+v", r)
	}
}

// TestUnauthenticatedAuditIsBounded: a flood of requests with bad tokens
// gets records up to the rate bound only, and the next record written is
// preceded by one that counts the rest, so nothing goes unaccounted.
func TestUnauthenticatedAuditIsBounded(t *testing.T) {
	tokens, tok := tokenStore(t, "ci")
	l, dir := openAudit(t, nil)
	srv := &Server{Tokens: tokens, Audit: l}
	h := srv.Handler()
	send := func(method, token string) int {
		r := httptest.NewRequest(method, "/v1/sandboxes/kill", strings.NewReader(`{"ids":["sb-1"]}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+token)
		r.RemoteAddr = "192.0.2.1:4000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	// Each record is fsynced: on a slow disk the bucket refills while
	// the flood runs. So the flood goes on until a request did go
	// unrecorded (the bucket is empty), not for a fixed count.
	flood := 0
	floodUntilUnrecorded := func() {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); srv.unauthAudit.skipped.Load() == 0; flood++ {
			if time.Now().After(deadline) {
				t.Fatalf("%d refused requests, none went unrecorded", flood)
			}
			if code := send(http.MethodPost, "wrong"); code != 401 {
				t.Fatalf("bad token: %d", code)
			}
		}
	}
	start := time.Now()
	floodUntilUnrecorded()
	time.Sleep(200 * time.Millisecond) // the bucket refills a few tokens mid-flood: the next request is recorded
	if code := send(http.MethodPost, "wrong"); code != 401 {
		t.Fatalf("bad token: %d", code)
	}
	flood++
	floodUntilUnrecorded()
	allowed := unauthAuditBurst + int(time.Since(start).Seconds()*unauthAuditRate) + 1
	send(http.MethodPut, tok) // authenticated (a 405): its record comes after the last count
	// Each refused request has its own record or is in a count; a count
	// precedes every record written after requests went unrecorded (a
	// refilled token mid-flood, the authenticated request at the end).
	recs := tailAll(t, dir)
	own, counted, counts := 0, 0, 0
	for _, r := range recs {
		switch r.Action {
		case "POST /v1/sandboxes/kill":
			own++
		case actionUnauthNotRecorded:
			var n int
			if _, err := fmt.Sscanf(r.Error, "%d requests refused by authentication were not recorded", &n); err != nil || n <= 0 {
				t.Fatalf("count record: %+v", r)
			}
			counted += n
			counts++
		}
	}
	if own < unauthAuditBurst || own > allowed || own+counted != flood || counts < 2 {
		t.Fatalf("%d own records and %d counted in %d records of %d refused requests (at most %d own; a count mid-flood and one at the end)", own, counted, counts, flood, allowed)
	}
	last, prev := recs[len(recs)-1], recs[len(recs)-2]
	if prev.Action != actionUnauthNotRecorded || last.Token != "ci" {
		t.Errorf("after the flood: %+v / %+v", prev, last)
	}
}

// After a failed audit write, mutating requests are refused with 503
// (reads go on) until a write succeeds; the first record then says what
// happened meanwhile.
func TestAuditFailsClosed(t *testing.T) {
	anchors := &flakyAnchors{}
	l, dir := openAudit(t, anchors)
	m := metrics.New("test")
	h := (&Server{Audit: l, Metrics: m}).Handler()

	if rec := badFork(h, "r1"); rec.Code != 400 {
		t.Fatalf("first request: %d", rec.Code)
	}
	anchors.setFail(errors.New("no space left on device"))
	if rec := badFork(h, "r2"); rec.Code != 400 {
		t.Fatalf("the request whose record fails still ran: %d", rec.Code)
	}
	rec := badFork(h, "r3")
	p := problemOf(t, rec)
	if rec.Code != 503 || p.Code != "unavailable" || rec.Header().Get("Retry-After") == "" || p.RequestID != "r3" ||
		!strings.Contains(p.Detail, "the audit log "+dir+" cannot be written") || !strings.Contains(p.Detail, "no space left on device") ||
		!strings.Contains(p.Detail, "2 failed writes, 1 requests refused") {
		t.Fatalf("while failing: %d %+v", rec.Code, p)
	}
	if rec := do(h, http.MethodGet, "/v1/healthz", nil); rec.Code != 200 {
		t.Fatalf("a read while failing: %d", rec.Code)
	}
	if n := failures(t, m); n != 2 {
		t.Fatalf("forkd_audit_write_failures_total = %v, want 2", n)
	}

	anchors.setFail(nil)
	if rec := badFork(h, "r4"); rec.Code != 400 {
		t.Fatalf("after recovery: %d %s", rec.Code, rec.Body)
	}
	recs := tailAll(t, dir)
	if len(recs) != 4 {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	if recs[0].RequestID != "r1" || recs[1].RequestID != "r2" || recs[3].RequestID != "r4" {
		t.Errorf("request records: %+v", recs)
	}
	res := recs[2]
	if res.Action != ActionAuditResumed || res.RequestID != "r4" || res.Detail["requests_refused"] != float64(1) ||
		res.Detail["write_failures"] != float64(2) || !strings.Contains(res.Detail["last_error"].(string), "no space left on device") {
		t.Errorf("resume record: %+v", res)
	}
	rep, err := audit.VerifyAnchored(dir, anchors.a)
	if err != nil || !rep.OK || rep.Head.Seq != 4 {
		t.Fatalf("log after the gap: %+v %v", rep, err)
	}
}

func failures(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "forkd_audit_write_failures_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no forkd_audit_write_failures_total")
	return 0
}

func TestRecordEventAndOperations(t *testing.T) {
	l, dir := openAudit(t, nil)
	s := &Server{Audit: l}
	s.RecordEvent("sandbox.died", []string{"sb-1"}, nil, map[string]any{"reason": "qemu exited"})
	ok := s.ops.start("image.build", "minimal", "")
	s.ops.update(ok.ID, func(op *apiv1.Operation) {
		op.State, op.Result = apiv1.OpSucceeded, json.RawMessage(`{"digest":"sha256-abc"}`)
	})
	s.auditOperationFinished(ok.ID)
	bad := s.ops.start("image.build", "py-pandas", "")
	s.auditOperationFinished(bad.ID) // still running: nothing
	s.ops.update(bad.ID, func(op *apiv1.Operation) {
		p := ProblemOf(errors.Join(errors.New("apt failed"), errdefs.ErrUnavailable), "")
		op.State, op.Error = apiv1.OpFailed, &p
	})
	s.auditOperationFinished(bad.ID)
	recs := tailAll(t, dir)
	if len(recs) != 3 {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	if r := recs[0]; r.Action != "sandbox.died" || r.Targets[0] != "sb-1" || r.Outcome != "ok" || r.Detail["reason"] != "qemu exited" {
		t.Errorf("event: %+v", r)
	}
	if r := recs[1]; r.Action != ActionOperationFinished || strings.Join(r.Targets, ",") != ok.ID+",minimal,sha256-abc" || r.Outcome != "ok" || r.Detail["kind"] != "image.build" {
		t.Errorf("finished build: %+v", r)
	}
	if r := recs[2]; r.Outcome != "unavailable" || !strings.Contains(r.Error, "apt failed") || r.Detail["state"] != apiv1.OpFailed {
		t.Errorf("failed build: %+v", r)
	}
	(&Server{}).RecordEvent("sandbox.died", nil, nil, nil) // no log: no-op
}

// A request cannot make its own record too long to write: the path, the
// ids in it and the error quoting them are bounded. Before, a long path
// (JSON escaping '<' six-fold) made the log refuse the record: the
// request went unrecorded, the failure counter rose and the gate closed,
// even for a request auth refused.
func TestAuditRecordIsBounded(t *testing.T) {
	tokens, err := auth.Open(filepath.Join(t.TempDir(), auth.StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	l, dir := openAudit(t, nil)
	m := metrics.New("test")
	long := strings.Repeat("%3C", 200_000) // 200,000 '<', 1.2 MB once JSON-escaped
	for _, c := range []struct {
		srv    *Server
		target string
		code   int
	}{
		{&Server{Audit: l, Metrics: m, Tokens: tokens}, "/v1/" + long, 401},                       // no route, no token
		{&Server{Audit: l, Metrics: m}, "/v1/" + long, 404},                                       // no route: the error quotes the path
		{&Server{Audit: l, Metrics: m}, "/v1/sandboxes/" + long + "/processes/0/signal", 400},     // a route: the id is a target
		{&Server{Audit: l, Metrics: m, Tokens: tokens}, "/v1/sandboxes/" + long + "/branch", 401}, // the same, refused by auth
	} {
		rec := httptest.NewRecorder()
		c.srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, c.target, nil))
		if rec.Code != c.code {
			t.Fatalf("%.60s: %d, want %d", c.target, rec.Code, c.code)
		}
	}
	if n := failures(t, m); n != 0 {
		t.Errorf("forkd_audit_write_failures_total = %v: a client's request made its record unwritable", n)
	}
	recs := tailAll(t, dir)
	if len(recs) != 4 {
		t.Fatalf("%d records, want one per request: %+v", len(recs), recs)
	}
	for i, r := range recs {
		line, _ := json.Marshal(r)
		if r.Action == ActionAuditResumed || len(line) > 64<<10 {
			t.Errorf("record %d: %d bytes, action %.80q", i, len(line), r.Action)
		}
	}
	if r := recs[0]; r.Outcome != "unauthenticated" || !strings.HasPrefix(r.Action, "POST /v1/<<<") || !strings.HasSuffix(r.Action, "...(200009 bytes)") {
		t.Errorf("unauthenticated, no route: %.100q %s", r.Action, r.Outcome)
	}
	if r := recs[1]; r.Outcome != "not_found" || !strings.HasPrefix(r.Error, "no route POST /v1/<<<") || !strings.Contains(r.Error, "bytes)") {
		t.Errorf("no route: %.100q", r.Error)
	}
	if r := recs[2]; r.Action != "POST /v1/sandboxes/{id}/processes/{pid}/signal" || len(r.Targets) != 2 ||
		!strings.HasSuffix(r.Targets[0], "...(200000 bytes)") || r.Targets[1] != "0" || r.Outcome != "invalid_argument" {
		t.Errorf("a route: %.100q %.100q %s", r.Action, r.Targets, r.Outcome)
	}
	if r := recs[3]; r.Action != "POST /v1/sandboxes/{id}/branch" || len(r.Targets) != 1 || len(r.Targets[0]) > 300 || r.Outcome != "unauthenticated" {
		t.Errorf("a route, refused by auth: %.100q %.100q %s", r.Action, r.Targets, r.Outcome)
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcd", 3, "abc...(4 bytes)"},
		{"aé", 2, "a...(3 bytes)"}, // never half a rune
		{"", 0, ""},
	} {
		if got := clip(c.s, c.n); got != c.want {
			t.Errorf("clip(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}

// A path ServeMux redirects to its clean form ran no route: its record
// must not read as the route it was redirected to, succeeding on the
// sandbox the path named first.
func TestAuditRedirectIsNotTheRoute(t *testing.T) {
	l, dir := openAudit(t, nil)
	h := (&Server{Audit: l}).Handler()
	rec := do(h, http.MethodDelete, "/v1/sandboxes/sb-1/../sb-victim", nil)
	if rec.Code/100 != 3 {
		t.Fatalf("unclean path: %d, want a redirect", rec.Code)
	}
	recs := tailAll(t, dir)
	if len(recs) != 1 {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	if r := recs[0]; r.Action != "DELETE /v1/sandboxes/sb-1/../sb-victim" || len(r.Targets) != 0 || r.Outcome != "http_"+strconv.Itoa(rec.Code) {
		t.Errorf("redirected request recorded as %+v", r)
	}
}

// Targets are the path's ids as the handler saw them: an escaped slash
// stays inside its segment.
func TestAuditTargetsUnescaped(t *testing.T) {
	l, dir := openAudit(t, nil)
	h := (&Server{Audit: l}).Handler()
	if rec := do(h, http.MethodPost, "/v1/sandboxes/sb-a%2Fsb-b/processes/0/signal", nil); rec.Code != 400 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if r := tailAll(t, dir)[0]; strings.Join(r.Targets, ",") != "sb-a/sb-b,0" {
		t.Errorf("targets %q, want [sb-a/sb-b 0]", r.Targets)
	}
}

// A mutating request whose handler panics is still recorded (it may have
// acted), and the panic goes on to net/http unchanged.
func TestAuditRecordsPanickedRequest(t *testing.T) {
	l, dir := openAudit(t, nil)
	s := &Server{Audit: l}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /boom/{id}", func(w http.ResponseWriter, r *http.Request) {
		noteTargets(r, "created-1")
		panic(http.ErrAbortHandler)
	})
	h := s.auditRequests(mux, s.auditAdmit(mux))
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Errorf("panic %v, want http.ErrAbortHandler passed on", p)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/boom/sb-1", nil))
	}()
	recs := tailAll(t, dir)
	if len(recs) != 1 {
		t.Fatalf("%d records, want the panicked request's", len(recs))
	}
	if r := recs[0]; r.Action != "POST /boom/{id}" || strings.Join(r.Targets, ",") != "sb-1,created-1" || r.Outcome != "internal" || !strings.Contains(r.Error, "panicked") {
		t.Errorf("record %+v", r)
	}
}

// An exec whose stream fails after the 200 (the agent went away) is
// recorded with that failure, as run_code streams and snapshot creation
// are, not as a success.
func TestAuditExecStreamFailure(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(agentapi.PidHeader, "42")
		w.Header().Set("Content-Type", "application/x-ndjson")
		json.NewEncoder(w).Encode(agentapi.ExecEvent{Type: agentapi.EventStdout, Data: []byte("hi")})
		// No exit event: the stream is cut.
	}))
	defer agent.Close()
	client := agentclient.NewHTTP(agent.Client(), agent.URL)
	l, dir := openAudit(t, nil)
	s := &Server{Audit: l}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		proxyExec(w, r, client, apiv1.ExecRequest{Argv: []string{"echo", "hi"}})
	})
	h := s.auditRequests(mux, s.auditAdmit(mux))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/sandboxes/sb-1/exec", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"exit"`) || rec.Header().Get(apiv1.PidHeader) != "42" {
		t.Fatalf("exec: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	recs := tailAll(t, dir)
	if len(recs) != 1 {
		t.Fatalf("%d records", len(recs))
	}
	if r := recs[0]; r.Outcome == audit.OutcomeOK || !strings.Contains(r.Error, "without an exit event") {
		t.Errorf("record of a failed exec stream: %+v", r)
	}
}
