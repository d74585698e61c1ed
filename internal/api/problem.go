package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// StatusOf maps an error class to its HTTP status. It is the only place
// where that mapping lives on the server side.
func StatusOf(err error) int {
	switch {
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsAlreadyExists(err):
		return http.StatusConflict
	case errdefs.IsUnauthenticated(err):
		return http.StatusUnauthorized
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
