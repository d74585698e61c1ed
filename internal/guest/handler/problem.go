package handler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"syscall"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// HTTPStatus maps an errdefs class code to the HTTP status of its problem
// response. The host client decodes the code from the body; the status is
// for humans and generic HTTP tooling.
func HTTPStatus(code string) int {
	switch code {
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "failed_precondition":
		return http.StatusConflict
	case "invalid_argument":
		return http.StatusBadRequest
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "unavailable":
		return http.StatusServiceUnavailable
	case "not_implemented":
		return http.StatusNotImplemented
	case "canceled":
		return 499 // client closed request (nginx's convention)
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// writeProblem answers err as a problem document.
func writeProblem(w http.ResponseWriter, err error) {
	code := errdefs.Code(err)
	status := HTTPStatus(code)
	p := agentapi.Problem{Title: http.StatusText(status), Status: status, Detail: err.Error(), Code: code}
	b, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeJSON answers v with 200.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, fmt.Errorf("encoding the response: %v: %w", err, errdefs.ErrInternal))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)+1))
	w.Write(append(b, '\n'))
}

// maxJSONBody bounds request documents (run_code carries code).
const maxJSONBody = 64 << 20

// readJSON decodes the request body into v; a malformed body is an
// invalid-argument error.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return fmt.Errorf("reading the request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding the request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// maxControlBody bounds the small control documents of a running exec
// (signal, resize).
const maxControlBody = 4 << 10

// readControl decodes a control document of at most maxControlBody bytes
// into v: "decoding WHAT: ...[: HINT]" when it is not JSON. An empty body
// leaves v as it is when emptyOK.
func readControl(r *http.Request, v any, what, hint string, emptyOK bool) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxControlBody))
	if err != nil {
		return fmt.Errorf("reading the request: %v: %w", err, errdefs.ErrCanceled)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 && emptyOK {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		if hint != "" {
			return fmt.Errorf("decoding %s: %v: %s: %w", what, err, hint, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("decoding %s: %v: %w", what, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// fsError gives a file-system error its errdefs class, keeping the OS's
// words ("open /x: no such file or directory").
func fsError(err error) error {
	var class error
	switch {
	case errdefs.Code(err) != "internal" || errors.Is(err, errdefs.ErrInternal):
		return err // already classified
	case errors.Is(err, fs.ErrNotExist):
		class = errdefs.ErrNotFound
	case errors.Is(err, fs.ErrExist):
		class = errdefs.ErrAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS), errors.Is(err, syscall.ENOTEMPTY),
		errors.Is(err, syscall.EBUSY), errors.Is(err, syscall.ETXTBSY):
		class = errdefs.ErrFailedPrecondition
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENAMETOOLONG),
		errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ELOOP):
		class = errdefs.ErrInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EMFILE),
		errors.Is(err, syscall.ENFILE), errors.Is(err, syscall.ENOMEM):
		class = errdefs.ErrResourceExhausted
	default:
		class = errdefs.ErrInternal
	}
	return fmt.Errorf("%w: %w", err, class)
}
