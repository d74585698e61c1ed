package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// jsonMediaType is the media type of every JSON request body.
const jsonMediaType = "application/json"

// decodeStrictJSON decodes data, a JSON document from a header or a
// query value (the X-Forkd-Exec header), as strictly as a JSON body: one
// value, no unknown fields, nothing after it. Errors are
// errdefs.ErrInvalidArgument and say what was wrong; the caller names
// where the document came from.
func decodeStrictJSON(data []byte, v any) error {
	return decodeStrict(bytes.NewReader(data), v)
}

// decodeStrict reads one JSON value from r into v: no unknown fields and
// nothing but white space after it. A read error (a body over its limit)
// is returned as it is, for the caller to classify.
func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if isReadError(err) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("malformed JSON: empty: %w", errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("malformed JSON: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	// Token, not More: More is false before a stray '}' or ']'.
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil && isReadError(err):
		return err
	default:
		return fmt.Errorf("malformed JSON: more than one value, or data after the value: %w", errdefs.ErrInvalidArgument)
	}
}

// isReadError reports an error of the body's reader rather than of the
// JSON in it (a body over http.MaxBytesReader's limit, or not sent within
// jsonBodyTimeout).
func isReadError(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe) || errors.Is(err, os.ErrDeadlineExceeded)
}

// jsonBodyTimeout bounds reading a JSON body (at most MaxJSONBody): the
// server has no timeout for whole bodies, which would cut off uploads
// and exec's stdin, so a client that sends a small body slowly would
// otherwise hold its connection and handler for as long as it likes.
var jsonBodyTimeout = time.Minute

// decode reads a strict JSON body: the JSON content type (else 415; a
// missing Content-Type too, so a client that forgot it learns it here),
// at most MaxJSONBody bytes (else 413), no unknown fields, exactly one
// value (else 400). Every error is errdefs.ErrInvalidArgument, whatever its
// status.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeUpTo(w, r, v, MaxJSONBody)
}

// decodeUpTo is decode with a body of at most limit bytes.
func decodeUpTo(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return withStatus(http.StatusUnsupportedMediaType,
			fmt.Errorf("no Content-Type: this route takes a JSON body; send Content-Type: %s: %w", jsonMediaType, errdefs.ErrInvalidArgument))
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != jsonMediaType {
		return withStatus(http.StatusUnsupportedMediaType,
			fmt.Errorf("content type %q: this route takes a JSON body; send Content-Type: %s: %w", ct, jsonMediaType, errdefs.ErrInvalidArgument))
	}
	// The deadline must end with the read: once the body is read the
	// server watches the connection for the client going away, and a
	// deadline passing then would cancel the request (a fork, a build,
	// run_code's stream). Writers that cannot (in-process ones) need none.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(jsonBodyTimeout))
	err := decodeStrict(http.MaxBytesReader(w, r.Body, limit), v)
	rc.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The rest of the body is not coming: the server must not wait
		// to read it before it answers, as it does to reuse a connection.
		w.Header().Set("Connection", "close")
		return withStatus(http.StatusRequestTimeout,
			fmt.Errorf("request body not sent within %s, the limit for JSON bodies: %w", jsonBodyTimeout, errdefs.ErrInvalidArgument))
	}
	if isReadError(err) {
		return withStatus(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body over %d bytes, the limit for JSON bodies (files go through PUT .../files, which streams): %w", MaxJSONBody, errdefs.ErrInvalidArgument))
	}
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}
