package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

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
// JSON in it (a body over http.MaxBytesReader's limit).
func isReadError(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

// decode reads a strict JSON body: the JSON content type (else 415; a
// missing Content-Type too, so a client that forgot it learns it here),
// at most MaxJSONBody bytes (else 413), no unknown fields, exactly one
// value (else 400). Every error is errdefs.ErrInvalidArgument, whatever its
// status.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return withStatus(http.StatusUnsupportedMediaType,
			fmt.Errorf("no Content-Type: this route takes a JSON body; send Content-Type: %s: %w", jsonMediaType, errdefs.ErrInvalidArgument))
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != jsonMediaType {
		return withStatus(http.StatusUnsupportedMediaType,
			fmt.Errorf("content type %q: this route takes a JSON body; send Content-Type: %s: %w", ct, jsonMediaType, errdefs.ErrInvalidArgument))
	}
	err := decodeStrict(http.MaxBytesReader(w, r.Body, MaxJSONBody), v)
	if isReadError(err) {
		return withStatus(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body over %d bytes, the limit for JSON bodies (files go through PUT .../files, which streams): %w", MaxJSONBody, errdefs.ErrInvalidArgument))
	}
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}
