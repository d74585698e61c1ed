package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// statusError gives an error a more precise HTTP status than its class's
// (413, 415, 405 are all invalid arguments): the problem's code, and so
// what clients map it back to, stays the class's.
type statusError struct {
	status int
	err    error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// withStatus makes err answer with status instead of its class's.
func withStatus(status int, err error) error { return &statusError{status: status, err: err} }

// StatusOf maps an error class to its HTTP status. It is the only place
// where that mapping lives on the server side; withStatus refines it for
// a few statuses HTTP has a name for (413, 415, 405).
func StatusOf(err error) int {
	if se := (*statusError)(nil); errors.As(err, &se) {
		return se.status
	}
	switch {
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsAlreadyExists(err):
		return http.StatusConflict
	case errdefs.IsUnauthenticated(err):
		return http.StatusUnauthorized
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsFailedPrecondition(err):
		return http.StatusConflict
	case errdefs.IsResourceExhausted(err):
		return http.StatusTooManyRequests
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	case errdefs.IsNotImplemented(err):
		return http.StatusNotImplemented
	case errors.Is(err, errdefs.ErrDeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, errdefs.ErrCanceled):
		return 499
	}
	return http.StatusInternalServerError
}

// ProblemOf renders an error as an RFC 9457 problem.
func ProblemOf(err error, requestID string) apiv1.Problem {
	status := StatusOf(err)
	return apiv1.Problem{
		Type:      "https://forkd.dev/problems/" + errdefs.Code(err),
		Title:     http.StatusText(status),
		Status:    status,
		Detail:    err.Error(),
		Code:      errdefs.Code(err),
		RequestID: requestID,
	}
}

// retryAfterSeconds is what 429 and 503 answers suggest: capacity frees
// within seconds (a fork or build finishing), not minutes.
const retryAfterSeconds = "2"

func writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	noteError(r, err)
	p := ProblemOf(err, requestID(r))
	w.Header().Set("Content-Type", "application/problem+json")
	if p.Status == http.StatusTooManyRequests || p.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

// probeMethods are the methods noRoute tries on a path to fill Allow.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// noRoute answers a request no route took. A path that has routes for
// other methods is 405 with Allow listing them (ServeMux would do that
// itself, but the catch-all "/" route, there to answer problem+json,
// takes every request first); any other is 404.
func noRoute(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range probeMethods {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		list := strings.Join(allow, ", ")
		w.Header().Set("Allow", list)
		writeProblem(w, r, withStatus(http.StatusMethodNotAllowed,
			fmt.Errorf("method %s is not allowed on %s: it takes %s: %w", r.Method, r.URL.Path, list, errdefs.ErrInvalidArgument)))
		return
	}
	writeProblem(w, r, fmt.Errorf("no route %s %s (see docs/ARCHITECTURE.md for the API): %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
}
