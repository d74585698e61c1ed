// Package errdefs defines the error classes forkd uses across layers.
//
// Code wraps one of these sentinels with %w and adds what the current layer
// knows ("snapshot %q: %w"). Callers branch with errors.Is or the IsX helpers;
// the API edge maps a class to an HTTP status in one place, and the client maps
// the status back, so errors.Is works across the wire.
package errdefs

import "errors"

// The classes. Each is a sentinel; wrap it, never compare strings.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrNotImplemented     = errors.New("not implemented")
	ErrCanceled           = errors.New("canceled")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrInternal           = errors.New("internal error")
	// ErrUnauthenticated: the request carried no valid credentials (HTTP 401).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the caller is known but its role may not do
	// this (HTTP 403). Objects of another tenant are ErrNotFound instead,
	// so that their existence is not revealed.
	ErrPermissionDenied = errors.New("permission denied")
)

func IsNotFound(err error) bool           { return errors.Is(err, ErrNotFound) }
func IsAlreadyExists(err error) bool      { return errors.Is(err, ErrAlreadyExists) }
func IsInvalidArgument(err error) bool    { return errors.Is(err, ErrInvalidArgument) }
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }
func IsResourceExhausted(err error) bool  { return errors.Is(err, ErrResourceExhausted) }
func IsUnavailable(err error) bool        { return errors.Is(err, ErrUnavailable) }
func IsNotImplemented(err error) bool     { return errors.Is(err, ErrNotImplemented) }
func IsUnauthenticated(err error) bool    { return errors.Is(err, ErrUnauthenticated) }
func IsPermissionDenied(err error) bool   { return errors.Is(err, ErrPermissionDenied) }

// Classes lists every class with its stable machine-readable code, in the
// order the API edge tries them.
var Classes = []struct {
	Code string
	Err  error
}{
	{"not_found", ErrNotFound},
	{"already_exists", ErrAlreadyExists},
	{"invalid_argument", ErrInvalidArgument},
	{"failed_precondition", ErrFailedPrecondition},
	{"resource_exhausted", ErrResourceExhausted},
	{"unavailable", ErrUnavailable},
	{"not_implemented", ErrNotImplemented},
	{"canceled", ErrCanceled},
	{"deadline_exceeded", ErrDeadlineExceeded},
	{"internal", ErrInternal},
	{"unauthenticated", ErrUnauthenticated},
	{"permission_denied", ErrPermissionDenied},
}

// Code returns the stable code of err's class, or "internal".
func Code(err error) string {
	for _, c := range Classes {
		if errors.Is(err, c.Err) {
			return c.Code
		}
	}
	return "internal"
}

// FromCode returns the sentinel for a code, or ErrInternal.
func FromCode(code string) error {
	for _, c := range Classes {
		if c.Code == code {
			return c.Err
		}
	}
	return ErrInternal
}
