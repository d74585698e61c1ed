package agentclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Limits on what the host reads from the agent. The guest runs untrusted
// code as root and its agent may be replaced by a hostile program, so no
// reply may make the host buffer without bound. A JSON value is buffered
// whole before it is decoded, in a buffer that doubles as it fills: a
// reply refused at its limit costs up to ~4x the limit in allocations, one
// under it that much plus the decoded value. File contents are not
// limited: ReadFile streams them through a fixed buffer.
const (
	// maxReply bounds the small JSON replies: info, identity, process
	// list, stat, mkdir, write file. Each is well under 64 KiB; a process
	// list of hundreds of long command lines still fits.
	maxReply = 4 << 20
	// maxListReply bounds a directory listing: ~200 bytes a FileInfo, so
	// ~150k entries in one directory.
	maxListReply = 32 << 20
	// maxRunCodeReply bounds a run-code result (and start python's warm-up
	// result, and each event of a streamed run). The agent keeps at most
	// 8 MiB each of stdout and stderr (pysession's MaxOutput); this leaves
	// room for JSON escaping and for a result or figures of several MiB.
	maxRunCodeReply = 32 << 20
	// maxExecEvent bounds one event of an exec stream: the agent sends at
	// most 32 KiB of output per event (execChunk), 44 KiB as base64.
	maxExecEvent = 1 << 20
	// maxProblemBody bounds an error reply: a problem document is a few
	// hundred bytes, and only its start is worth showing when it is not one.
	maxProblemBody = 64 << 10
)

// limitedDecoder decodes a stream of JSON values from the agent, refusing
// any value larger than limit bytes with an error that names the call.
type limitedDecoder struct {
	dec  *json.Decoder
	body limitedBody
}

// newEventDecoder returns a decoder of a stream of events, each at most
// limit bytes.
func newEventDecoder(r io.Reader, limit int64, what string) *limitedDecoder {
	return newLimitedDecoder(r, limit, what, true)
}

func newLimitedDecoder(r io.Reader, limit int64, what string, perEvent bool) *limitedDecoder {
	d := &limitedDecoder{body: limitedBody{r: r, limit: limit, what: what, perEvent: perEvent}}
	d.dec = json.NewDecoder(&d.body)
	return d
}

// Decode decodes the next value into v. The budget starts where the value
// does; bytes the decoder read ahead count against it, so nothing is read
// more than limit bytes past the start of the value being decoded.
func (d *limitedDecoder) Decode(v any) error {
	d.body.until = d.dec.InputOffset() + d.body.limit
	return d.dec.Decode(v)
}

// decodeLimited decodes one JSON value of at most limit bytes from r into
// v; over the limit, it fails with a *tooLargeError.
func decodeLimited(r io.Reader, limit int64, what string, v any) error {
	return newLimitedDecoder(r, limit, what, false).Decode(v)
}

// discardLimited reads and drops a reply the caller does not need (so its
// stream can carry the next request), up to limit bytes.
func discardLimited(r io.Reader, limit int64, what string) error {
	_, err := io.Copy(io.Discard, &limitedBody{r: r, limit: limit, until: limit, what: what})
	return err
}

// limitedBody reads r up to the offset until, then fails with a
// *tooLargeError.
type limitedBody struct {
	r     io.Reader
	read  int64 // bytes read from r so far
	until int64
	// For the error:
	limit    int64
	what     string
	perEvent bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	left := b.until - b.read
	if left <= 0 {
		// Too large, unless the body ends right here.
		var one [1]byte
		if n, err := io.ReadFull(b.r, one[:]); n == 0 {
			return 0, err
		}
		return 0, &tooLargeError{what: b.what, limit: b.limit, perEvent: b.perEvent}
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}

// tooLargeError is a reply over its limit. Its class is
// errdefs.ErrFailedPrecondition (409), not ResourceExhausted (429 with
// Retry-After): a broken or hostile agent, or a result too large to hand
// back (a huge directory, a huge repr), which no retry fixes.
type tooLargeError struct {
	what     string
	limit    int64
	perEvent bool
}

func (e *tooLargeError) Error() string {
	per := ""
	if e.perEvent {
		per = " in one event"
	}
	return fmt.Sprintf("agent reply to %s exceeds %s%s: the guest sent too much (a hostile or broken agent, or a result too large to return: ask for less)", e.what, mib(e.limit), per)
}

func (e *tooLargeError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// readError classifies a failure to read a reply: one over its limit as
// it is, anything else as transportError does.
func (c *Client) readError(ctx context.Context, op string, err error) error {
	var tl *tooLargeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tl):
		return tl
	}
	return c.transportError(ctx, op, err)
}

// mib formats a limit for an error message.
func mib(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatInt(n>>10, 10) + " KiB"
}
