package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Long operations (image build, snapshot create, compact, no-wait branch)
// are the daemon's: Start* returns the operation at once, WatchOperation
// follows it (and can be called again to re-attach), CancelOperation
// cancels it. A ctx that ends while watching detaches; the work goes on.

// errLegacyStream: a daemon from before operations answered a long
// request with its progress stream rather than 202.
var errLegacyStream = errors.New("daemon answered a progress stream")

// idempotencyHeader is the Idempotency-Key header for key (none if empty).
func idempotencyHeader(key string) http.Header {
	h := http.Header{}
	if key != "" {
		h.Set(apiv1.IdempotencyKeyHeader, key)
	}
	return h
}

// startOperation POSTs in to path asking for 202 and the operation.
func (c *Client) startOperation(ctx context.Context, path string, in any, key string) (apiv1.Operation, error) {
	hdr := idempotencyHeader(key)
	hdr.Set("Prefer", apiv1.PreferAsync)
	hdr.Set("Content-Type", "application/json")
	data, err := json.Marshal(in)
	if err != nil {
		return apiv1.Operation{}, err
	}
	resp, err := c.send(ctx, http.MethodPost, path, nil, bytes.NewReader(data), hdr)
	if err != nil {
		return apiv1.Operation{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return apiv1.Operation{}, errLegacyStream
	}
	var op apiv1.Operation
	if err := json.NewDecoder(resp.Body).Decode(&op); err != nil {
		return op, fmt.Errorf("decode POST %s response: %w", path, err)
	}
	return op, nil
}

// StartCreateSnapshot starts a snapshot create and returns its operation
// at once; key, if set, is its Idempotency-Key (a retry gets the same
// operation).
func (c *Client) StartCreateSnapshot(ctx context.Context, req apiv1.CreateSnapshotRequest, key string) (apiv1.Operation, error) {
	return c.startOperation(ctx, "/v1/snapshots", req, key)
}

// StartBuildImage starts an image build and returns its operation.
func (c *Client) StartBuildImage(ctx context.Context, req apiv1.BuildImageRequest, key string) (apiv1.Operation, error) {
	op, err := c.startOperation(ctx, "/v1/images", req, key)
	if errors.Is(err, errLegacyStream) {
		err = fmt.Errorf("daemon did not answer the build with an operation: %w", errdefs.ErrInternal)
	}
	return op, err
}

// StartCompact starts writing a flat copy of from under to and returns
// its operation.
func (c *Client) StartCompact(ctx context.Context, from, to string) (apiv1.Operation, error) {
	op, err := c.startOperation(ctx, "/v1/snapshots/"+url.PathEscape(from)+"/compact", apiv1.CompactRequest{To: to}, "")
	if errors.Is(err, errLegacyStream) {
		err = fmt.Errorf("this daemon compacts only synchronously; upgrade it, or use Compact: %w", errdefs.ErrNotImplemented)
	}
	return op, err
}

// PullSnapshot has the daemon fetch a snapshot artifact from a registry
// and follows the operation until it ends.
func (c *Client) PullSnapshot(ctx context.Context, req apiv1.PullSnapshotRequest, onMsg func(string)) (apiv1.Snapshot, error) {
	op, err := c.startOperation(ctx, "/v1/snapshots/pull", req, "")
	if errors.Is(err, errLegacyStream) {
		err = fmt.Errorf("this daemon cannot pull snapshots; upgrade it: %w", errdefs.ErrNotImplemented)
	}
	if err != nil {
		return apiv1.Snapshot{}, err
	}
	var snap apiv1.Snapshot
	return snap, c.awaitOperation(ctx, op.ID, onMsg, &snap)
}

// Operation polls one operation.
func (c *Client) Operation(ctx context.Context, id string) (apiv1.Operation, error) {
	var op apiv1.Operation
	return op, c.call(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil, nil, &op)
}

// Operations lists the operations the caller may see, oldest first.
func (c *Client) Operations(ctx context.Context) ([]apiv1.Operation, error) {
	return listAll[apiv1.Operation](ctx, c, "/v1/operations", nil)
}

// CancelOperation asks the daemon to cancel a running operation; it
// returns the operation with cancel_requested set (WatchOperation says
// when it has ended).
func (c *Client) CancelOperation(ctx context.Context, id string) (apiv1.Operation, error) {
	var op apiv1.Operation
	return op, c.call(ctx, http.MethodPost, "/v1/operations/"+url.PathEscape(id)+"/cancel", nil, nil, &op)
}

// WatchOperation follows an operation's events, calling onEvent (if set)
// for each, until it ends, and returns it as it ended. If ctx ends first
// it returns ctx's error: the operation goes on.
func (c *Client) WatchOperation(ctx context.Context, id string, onEvent func(apiv1.OperationEvent)) (apiv1.Operation, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id)+"/events", nil, nil, http.Header{"Accept": {"application/x-ndjson"}})
	if err != nil {
		return apiv1.Operation{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var last apiv1.Operation
	for sc.Scan() {
		var ev apiv1.OperationEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return last, fmt.Errorf("decode operation event: %w", err)
		}
		if onEvent != nil {
			onEvent(ev)
		}
		if ev.Operation != nil {
			last = *ev.Operation
			if last.Terminal() {
				return last, nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return last, err
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return last, fmt.Errorf("operation %s: event stream cut: %w", id, err)
	}
	return last, fmt.Errorf("operation %s: event stream ended before the operation did (daemon stopped?); re-attach with `forkd operation watch %s`: %w", id, id, errdefs.ErrUnavailable)
}

// OperationResult decodes a finished operation's result into out, or
// returns why it did not succeed (an *Error of its problem's class).
func OperationResult(op apiv1.Operation, out any) error {
	switch {
	case op.State == apiv1.OpSucceeded:
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(op.Result, out); err != nil {
			return fmt.Errorf("decode the result of operation %s: %w", op.ID, err)
		}
		return nil
	case op.Error != nil:
		return &Error{*op.Error}
	default:
		return fmt.Errorf("operation %s ended %s: %w", op.ID, op.State, errdefs.ErrInternal)
	}
}

// awaitOperation follows id to its end, reporting progress lines to
// onMsg, and decodes its result into out.
func (c *Client) awaitOperation(ctx context.Context, id string, onMsg func(string), out any) error {
	op, err := c.WatchOperation(ctx, id, func(ev apiv1.OperationEvent) {
		if onMsg == nil {
			return
		}
		switch {
		case ev.Message != "":
			onMsg(ev.Message)
		case ev.Operation != nil && !ev.Operation.Terminal():
			for _, m := range ev.Operation.Progress { // what it said before we attached
				onMsg(m)
			}
		}
	})
	if err != nil {
		return err
	}
	return OperationResult(op, out)
}
