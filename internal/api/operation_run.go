package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// Long operations: one pattern for daemon-owned work (image build,
// snapshot create, compact, no-wait branch). startOperation records an
// operation and runs the work on the engine's lifetime context
// (Engine.Go), never on the request's: a client that disconnects, or a
// CLI that is interrupted, leaves it running. Only POST
// /v1/operations/{id}/cancel (or the daemon shutting down) cancels it;
// the work's own cleanup (the snapshot store's staging, Stage.Abort)
// leaves no partial tag. A request that asks for it (wantsAsync) gets 202
// and the operation at once; one that does not is answered when the work
// ends, as before operations existed, but the work goes on without it.

// errOpCancelled is the cause a cancelled operation's work sees.
var errOpCancelled = fmt.Errorf("operation cancelled by request: %w", errdefs.ErrCanceled)

// opProgress is how work reports progress to its operation's followers.
type opProgress struct {
	ops *operations
	id  string
}

// Message adds a progress line.
func (p opProgress) Message(msg string) { p.ops.message(p.id, msg) }

// Bytes reports the current step's byte progress (total 0: unknown). It
// is the seam progress bars read (events of type progress with
// done_bytes and total_bytes).
func (p opProgress) Bytes(done, total int64) {
	p.ops.update(p.id, func(op *apiv1.Operation) { op.DoneBytes, op.TotalBytes = done, total })
}

// opWork is daemon-owned work: it runs on ctx (ended by a cancel or the
// daemon's shutdown), reports through p, and returns the operation's
// result, encoded as JSON.
type opWork func(ctx context.Context, p opProgress) (any, error)

// startOperation starts work as an operation of kind on target, owned by
// r's tenant, and returns it as it starts (running). It fails only when
// the daemon is shutting down, and then the work does not run.
func (s *Server) startOperation(r *http.Request, kind, target string, work opWork) (apiv1.Operation, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	op := s.ops.start(kind, target, s.principalOf(r).Tenant, cancel)
	err := s.Engine.Go(ctx, func(wctx context.Context) {
		defer cancel(nil)
		res, err := work(wctx, opProgress{ops: &s.ops, id: op.ID})
		s.finishOperation(wctx, op.ID, res, err)
	})
	if err != nil {
		cancel(nil)
		s.ops.drop(op.ID)
		return apiv1.Operation{}, err
	}
	noteTargets(r, op.ID)
	return op, nil
}

// finishOperation records how id's work ended, audits it and tells the
// event streams.
func (s *Server) finishOperation(ctx context.Context, id string, res any, err error) {
	var data []byte
	if err == nil {
		data, err = json.Marshal(res)
	}
	cause := context.Cause(ctx)
	s.ops.update(id, func(op *apiv1.Operation) {
		var p apiv1.Problem
		switch {
		case err == nil:
			op.State, op.Result = apiv1.OpSucceeded, data
			return
		case errors.Is(cause, errOpCancelled):
			op.State, p = apiv1.OpCancelled, ProblemOf(errOpCancelled, "")
		case errors.Is(cause, sandbox.ErrEngineClosed):
			op.State, p = apiv1.OpFailed, ProblemOf(fmt.Errorf("%s interrupted: %w", op.Kind, cause), "")
		default:
			op.State, p = apiv1.OpFailed, ProblemOf(err, "")
		}
		op.Error = &p
	})
	s.auditOperationFinished(id)
	if op, ok := s.ops.get(id); ok {
		s.publishOperation(op)
	}
}

// wantsAsync reports whether r asked for 202 and the operation at once:
// Prefer: respond-async (RFC 7240), or ?async=true.
func wantsAsync(r *http.Request) (bool, error) {
	for _, v := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(pref), apiv1.PreferAsync) {
				return true, nil
			}
		}
	}
	return httpquery.Bool(r.URL.Query(), "async", false)
}

// operationAnswer returns how a handler answers the operation it started
// (or the one a replayed Idempotency-Key names): 202 with it when r asked
// (wantsAsync), else wait(opID) (nil: 202 always).
func (s *Server) operationAnswer(w http.ResponseWriter, r *http.Request, wait func(opID string)) (func(opID string), error) {
	async, err := wantsAsync(r)
	if err != nil {
		return nil, err
	}
	return func(opID string) {
		if async || wait == nil {
			op, _ := s.ops.get(opID)
			writeAccepted(w, op)
			return
		}
		wait(opID)
	}, nil
}

// writeAccepted answers 202 with op, Location naming it.
func writeAccepted(w http.ResponseWriter, op apiv1.Operation) {
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	w.Header().Set("Preference-Applied", apiv1.PreferAsync)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(op)
}

// awaitResult waits, on r's context, for op to end and answers status with
// its result (or its problem). A client that goes away stops the wait,
// not the operation.
func (s *Server) awaitResult(w http.ResponseWriter, r *http.Request, id string, status int) {
	w.Header().Set(apiv1.OperationHeader, id)
	ctx, done := s.streamContext(r)
	defer done()
	op, err := s.ops.wait(ctx, id)
	switch {
	case err != nil && r.Context().Err() == nil:
		writeProblem(w, r, fmt.Errorf("the daemon is stopping; operation %s goes on until it does (forkd operation watch %s): %w", id, id, errdefs.ErrUnavailable))
	case err != nil:
		noteError(r, fmt.Errorf("client left before operation %s ended (it goes on): %w", id, err))
	case op.State != apiv1.OpSucceeded:
		writeProblem(w, r, opError(op))
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(append(op.Result, '\n'))
	}
}

// opProblem is an operation's recorded problem as an error that keeps its
// class.
type opProblem struct{ p apiv1.Problem }

func (e opProblem) Error() string { return e.p.Detail }
func (e opProblem) Unwrap() error { return errdefs.FromCode(e.p.Code) }

// opError is why a finished operation did not succeed.
func opError(op apiv1.Operation) error {
	if op.Error == nil {
		return fmt.Errorf("operation %s ended %s: %w", op.ID, op.State, errdefs.ErrInternal)
	}
	return opProblem{*op.Error}
}
