package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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
		errdefs.ErrNotImplemented: 501, errdefs.ErrUnauthenticated: 401, errdefs.ErrDeadlineExceeded: 504, errors.New("plain"): 500,
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
	if err := decodeBody("application/json", `{"tag":"a","count":1}`); err != nil {
		t.Fatalf("valid body: %v", err)
	}
	for name, c := range map[string][2]string{
		"malformed":     {"application/json", `{"tag":`},
		"unknown field": {"application/json", `{"tag":"a","cuont":1}`},
		"two values":    {"application/json", `{"tag":"a"}{"tag":"b"}`},
		"wrong type":    {"text/plain", `{"tag":"a"}`},
		"oversized":     {"application/json", `{"tag":"` + strings.Repeat("a", MaxJSONBody) + `"}`},
	} {
		if err := decodeBody(c[0], c[1]); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid argument", name, err)
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
	done := a.start("image.build", "minimal")
	a.update(done.ID, func(op *apiv1.Operation) { op.State, op.Result = apiv1.OpSucceeded, json.RawMessage(`{"digest":"x"}`) })
	running := a.start("image.build", "py-pandas")

	var b operations // the next daemon
	if err := b.load(store); err != nil {
		t.Fatal(err)
	}
	if op, ok := b.get(done.ID); !ok || op.State != apiv1.OpSucceeded || string(op.Result) != `{"digest":"x"}` {
		t.Fatalf("finished operation after restart: %+v", op)
	}
	op, ok := b.get(running.ID)
	if !ok || op.State != apiv1.OpFailed || op.Error == nil || !strings.Contains(op.Error.Detail, "daemon stopped") {
		t.Fatalf("interrupted operation after restart: %+v", op)
	}
}
