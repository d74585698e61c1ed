package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/state"
)

func TestStatusOfEveryClass(t *testing.T) {
	want := map[error]int{
		errdefs.ErrNotFound: 404, errdefs.ErrAlreadyExists: 409, errdefs.ErrInvalidArgument: 400,
		errdefs.ErrFailedPrecondition: 409, errdefs.ErrResourceExhausted: 429, errdefs.ErrUnavailable: 503,
		errdefs.ErrNotImplemented: 501, errdefs.ErrUnauthenticated: 401, errdefs.ErrPermissionDenied: 403, errdefs.ErrDeadlineExceeded: 504, errors.New("plain"): 500,
	}
	for err, status := range want {
		wrapped := fmt.Errorf("layer: %w", err)
		if got := StatusOf(wrapped); got != status {
			t.Errorf("StatusOf(%v) = %d, want %d", err, got, status)
		}
		p := ProblemOf(wrapped, "rid")
		if p.Status != status || p.RequestID != "rid" || p.Detail != wrapped.Error() {
			t.Errorf("ProblemOf(%v) = %+v", err, p)
		}
		// The client maps the code back to the same class.
		if status != 500 && !errors.Is(errdefs.FromCode(p.Code), err) {
			t.Errorf("code %q does not round-trip to %v", p.Code, err)
		}
	}
}

func decodeBody(ct, body string) error {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	var req apiv1.ForkRequest
	return decode(httptest.NewRecorder(), r, &req)
}

func TestDecodeIsStrict(t *testing.T) {
	for _, ct := range []string{"application/json", "application/json; charset=utf-8"} {
		if err := decodeBody(ct, `{"tag":"a","count":1}`+" \n"); err != nil {
			t.Fatalf("valid body (%s): %v", ct, err)
		}
	}
	for name, c := range map[string]struct {
		ct, body string
		status   int
		msg      string
	}{
		"malformed":         {"application/json", `{"tag":`, 400, "malformed JSON"},
		"empty":             {"application/json", ``, 400, "malformed JSON: empty"},
		"unknown field":     {"application/json", `{"tag":"a","cuont":1}`, 400, `unknown field "cuont"`},
		"two values":        {"application/json", `{"tag":"a"}{"tag":"b"}`, 400, "more than one value"},
		"stray brace after": {"application/json", `{"tag":"a"}}`, 400, "more than one value"},
		"wrong type":        {"text/plain", `{"tag":"a"}`, 415, `content type "text/plain": this route takes a JSON body; send Content-Type: application/json`},
		"no type":           {"", `{"tag":"a"}`, 415, "no Content-Type: this route takes a JSON body; send Content-Type: application/json"},
		"bad type":          {"application/", `{"tag":"a"}`, 415, "send Content-Type: application/json"},
		"oversized":         {"application/json", `{"tag":"` + strings.Repeat("a", MaxJSONBody) + `"}`, 413, fmt.Sprintf("request body over %d bytes", MaxJSONBody)},
	} {
		err := decodeBody(c.ct, c.body)
		if !errdefs.IsInvalidArgument(err) || StatusOf(err) != c.status || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v (status %d), want invalid argument, %d, %q", name, err, StatusOf(err), c.status, c.msg)
		}
		// The code clients map back stays the class's.
		if p := ProblemOf(err, ""); p.Status != c.status || p.Code != "invalid_argument" {
			t.Errorf("%s: problem %+v", name, p)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(`{"tag":"a","count":1}`)
	f.Add(`{"tag":1}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		err := decodeBody("application/json", body)
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Fatalf("decode error outside the invalid-argument class: %v", err)
		}
	})
}

// execFields are the JSON names of ExecRequest's fields.
func execFields() map[string]bool {
	out := map[string]bool{}
	typ := reflect.TypeFor[apiv1.ExecRequest]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		out[strings.ToLower(name)] = true
	}
	return out
}

func TestDecodeStrictJSONHeader(t *testing.T) {
	var req apiv1.ExecRequest
	if err := decodeStrictJSON([]byte(`{"argv":["ls"],"cwd":"/","env":{"A":"1"},"timeout_ms":5,"stdin":true}`), &req); err != nil || req.Argv[0] != "ls" || !req.Stdin {
		t.Fatalf("valid header: %+v %v", req, err)
	}
	for _, h := range []string{`{"argv":["ls"],"tiemout_ms":5}`, `{"argv":["ls"]} x`, `{"argv":["ls"]}}`, ``, `{"argv":"ls"}`, `null x`} {
		if err := decodeStrictJSON([]byte(h), &req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid argument", h, err)
		}
	}
}

// FuzzExecHeader: the X-Forkd-Exec decoder never panics, fails only with
// invalid argument, accepts only documents whose keys are ExecRequest's
// fields, and what it accepts survives a round trip.
func FuzzExecHeader(f *testing.F) {
	f.Add(`{"argv":["python3","-c","print(1)"],"env":{"A":"b"},"cwd":"/root","timeout_ms":1000,"stdin":true,"stdin_open":false}`)
	f.Add(`{"shell":"echo hi"}`)
	f.Add(`{"argv":["ls"],"unknown":1}`)
	f.Add(`{"argv":["ls"]}{}`)
	f.Add(`{"ARGV":["ls"]}`)
	f.Add(`null`)
	fields := execFields()
	f.Fuzz(func(t *testing.T, hdr string) {
		var req apiv1.ExecRequest
		err := decodeStrictJSON([]byte(hdr), &req)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("%q: error outside the invalid-argument class: %v", hdr, err)
			}
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(hdr), &m) == nil {
			for k := range m {
				if !fields[strings.ToLower(k)] {
					t.Fatalf("%q accepted with unknown field %q", hdr, k)
				}
			}
		}
		data, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var again apiv1.ExecRequest
		if err := decodeStrictJSON(data, &again); err != nil || !reflect.DeepEqual(normExec(again), normExec(req)) {
			t.Fatalf("round trip of %q: %+v != %+v (%v)", hdr, again, req, err)
		}
	})
}

// normExec makes empty and nil slices and maps equal (omitempty drops both).
func normExec(r apiv1.ExecRequest) apiv1.ExecRequest {
	if len(r.Argv) == 0 {
		r.Argv = nil
	}
	if len(r.Env) == 0 {
		r.Env = nil
	}
	return r
}

// do sends one request through h and returns the recorder.
func do(h http.Handler, method, target string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func problemOf(t *testing.T, rec *httptest.ResponseRecorder) apiv1.Problem {
	t.Helper()
	var p apiv1.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("not a problem (%v): %d %s", err, rec.Code, rec.Body)
	}
	return p
}

func TestWrongMethodIs405(t *testing.T) {
	h := (&Server{}).Handler()
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/v1/sandboxes", "GET, HEAD, POST"},
		{http.MethodPut, "/v1/sandboxes/sb-1", "GET, HEAD, PATCH, DELETE"},
		{http.MethodGet, "/v1/sandboxes/sb-1/exec", "POST"},
		{http.MethodPost, "/v1/healthz", "GET, HEAD"},
	} {
		rec := do(h, c.method, c.path, nil)
		p := problemOf(t, rec)
		if rec.Code != 405 || rec.Header().Get("Allow") != c.allow || p.Status != 405 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "it takes "+c.allow) || p.RequestID == "" {
			t.Errorf("%s %s: %d Allow %q %+v, want 405 with Allow %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"), p, c.allow)
		}
	}
	rec := do(h, http.MethodGet, "/v1/nope", nil)
	if p := problemOf(t, rec); rec.Code != 404 || rec.Header().Get("Allow") != "" || !strings.HasPrefix(p.Detail, "no route GET /v1/nope") {
		t.Errorf("unknown path: %d %+v", rec.Code, p)
	}
}

// TestBadBooleanQueryIs400: a boolean query value that does not parse is
// a 400 naming it, never read as false (DELETE ...?recursive=yes used to
// attempt a plain remove).
func TestBadBooleanQueryIs400(t *testing.T) {
	h := (&Server{}).Handler()
	for _, c := range []struct{ method, target, name string }{
		{http.MethodDelete, "/v1/sandboxes/sb-1/files?path=/tmp/d&recursive=yes", "recursive"},
		{http.MethodPost, "/v1/sandboxes/sb-1/processes/7/stdin?close=maybe", "close"},
		{http.MethodDelete, "/v1/snapshots/base?cascade=all", "cascade"},
		{http.MethodGet, "/v1/snapshots/base/archive?image=no-thanks", "image"},
		{http.MethodPost, "/v1/snapshots/import?force=2", "force"},
	} {
		rec := do(h, c.method, c.target, nil)
		p := problemOf(t, rec)
		if rec.Code != 400 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "query "+c.name+"=") {
			t.Errorf("%s %s: %d %+v", c.method, c.target, rec.Code, p)
		}
	}
}

func TestRequestIDFromClient(t *testing.T) {
	h := (&Server{}).Handler()
	for id, kept := range map[string]bool{
		"req-1":                       true,
		"mcp:abc_DEF.42":              true,
		strings.Repeat("a", 128):      true,
		strings.Repeat("a", 129):      false,
		"":                            false,
		"has space":                   false,
		`quo"te`:                      false,
		"new\nline":                   false,
		"ünï":                         false,
		"a/b":                         false,
		"{\"request_id\":\"forged\"}": false,
	} {
		rec := do(h, http.MethodGet, "/v1/nope", map[string]string{"X-Request-Id": id})
		got := rec.Header().Get("X-Request-Id")
		p := problemOf(t, rec)
		switch {
		case p.RequestID != got:
			t.Errorf("%q: problem carries %q, header %q", id, p.RequestID, got)
		case kept && got != id:
			t.Errorf("%q: replaced by %q", id, got)
		case !kept && (got == id || !validRequestID(got) || len(got) != 16):
			t.Errorf("%q: kept as %q, want a generated id", id, got)
		}
	}
}

func TestUnknownStateFilter(t *testing.T) {
	rec := do((&Server{}).Handler(), http.MethodGet, "/v1/sandboxes?state=zombie", nil)
	if p := problemOf(t, rec); rec.Code != 400 || !strings.Contains(p.Detail, `"zombie"`) ||
		!strings.Contains(p.Detail, apiv1.StateRunning) || !strings.Contains(p.Detail, apiv1.StateDead) || !strings.Contains(p.Detail, apiv1.StateStopped) {
		t.Errorf("unknown state: %d %+v", rec.Code, p)
	}
}

func TestProblemResponse(t *testing.T) {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/v1/x", nil)
	writeProblem(rec, r, fmt.Errorf("no sandbox %q: %w", "sb-x", errdefs.ErrNotFound))
	if rec.Code != 404 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("status %d type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var p apiv1.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Code != "not_found" || !strings.Contains(p.Detail, "sb-x") {
		t.Fatalf("problem %+v err %v", p, err)
	}
}

func TestRetryAfterOnCapacityErrors(t *testing.T) {
	for err, want := range map[error]string{
		errdefs.ErrResourceExhausted: retryAfterSeconds,
		errdefs.ErrUnavailable:       retryAfterSeconds,
		errdefs.ErrNotFound:          "",
	} {
		rec := httptest.NewRecorder()
		writeProblem(rec, httptest.NewRequest(http.MethodPost, "/v1/sandboxes", nil), fmt.Errorf("x: %w", err))
		if got := rec.Header().Get("Retry-After"); got != want {
			t.Errorf("%v: Retry-After %q, want %q", err, got, want)
		}
	}
}

func TestOperationsSurviveRestart(t *testing.T) {
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var a operations
	if err := a.load(store); err != nil {
		t.Fatal(err)
	}
	done := a.start("image.build", "minimal", "acme")
	a.update(done.ID, func(op *apiv1.Operation) { op.State, op.Result = apiv1.OpSucceeded, json.RawMessage(`{"digest":"x"}`) })
	running := a.start("image.build", "py-pandas", "")

	var b operations // the next daemon
	if err := b.load(store); err != nil {
		t.Fatal(err)
	}
	if op, ok := b.get(done.ID); !ok || op.State != apiv1.OpSucceeded || string(op.Result) != `{"digest":"x"}` || op.Tenant != "acme" {
		t.Fatalf("finished operation after restart: %+v", op)
	}
	op, ok := b.get(running.ID)
	if !ok || op.State != apiv1.OpFailed || op.Error == nil || !strings.Contains(op.Error.Detail, "daemon stopped") {
		t.Fatalf("interrupted operation after restart: %+v", op)
	}
}
