package api

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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

// Requests refused by auth are recorded, with no token name and the
// peer; reads are not.
func TestAuditRecordsUnauthenticated(t *testing.T) {
	tokens, err := auth.Open(filepath.Join(t.TempDir(), auth.StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Create("ci")
	if err != nil {
		t.Fatal(err)
	}
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
	ok := s.ops.start("image.build", "minimal")
	s.ops.update(ok.ID, func(op *apiv1.Operation) {
		op.State, op.Result = apiv1.OpSucceeded, json.RawMessage(`{"digest":"sha256-abc"}`)
	})
	s.auditOperationFinished(ok.ID)
	bad := s.ops.start("image.build", "py-pandas")
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
