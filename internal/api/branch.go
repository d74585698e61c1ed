package api

import (
	"context"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

func ms(us int64) float64 { return float64(us) / 1000 }

// branch snapshots a running sandbox into a new tag (201 with the snapshot
// and the pause the source saw). With no_wait it answers 202 at once: the
// tag is "writing" until the background branch, an operation of kind
// sandbox.branch (its result a BranchResponse), commits it.
func (s *Server) branch(w http.ResponseWriter, r *http.Request) {
	var req apiv1.BranchRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	// A retry with the key gets the first answer: the 201 with the
	// snapshot, or the 202 naming the background branch's operation.
	claim, ok := s.claimIdempotency(w, r, req, nil)
	if !ok {
		return
	}
	defer claim.release()
	opts := sandbox.BranchOptions{Tag: req.Tag, Mode: req.Mode, Tenant: auth.TenantOf(s.principalOf(r).Tenant)}
	if req.NoWait {
		s.branchAsync(w, r, opts, claim)
		return
	}
	// Engine.Branch validates the tag and mode.
	res, err := s.Engine.Branch(r.Context(), r.PathValue("id"), opts)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	s.claimSnapshot(r, res.Snapshot.Tag, res.Snapshot.ID)
	noteTargets(r, res.Snapshot.Tag)
	writeRecorded(w, r, claim, http.StatusCreated, s.branchResponse(s.principalOf(r), res))
}

// branchAsync starts a background branch as an operation and answers 202
// with the pending tag and the operation (Location: the tag, as before
// operations existed).
func (s *Server) branchAsync(w http.ResponseWriter, r *http.Request, opts sandbox.BranchOptions, claim *idemClaim) {
	p := s.principalOf(r)
	ctx, cancel := context.WithCancelCause(context.Background())
	op := s.ops.start(apiv1.OpSandboxBranch, opts.Tag, p.Tenant, cancel)
	pend, err := s.Engine.BranchAsync(ctx, r.PathValue("id"), opts, func(res *sandbox.BranchResult, err error) {
		defer cancel(nil)
		var out any
		switch {
		case err == nil:
			out = s.branchResponse(p, res)
		case s.leftNoTag(opts.Tag):
			// Cancelled, or stopped by the daemon's shutdown: the branch
			// left no tag and no failed entry (Engine.BranchAsync), so
			// nor may its owner record stay, to be found by whoever
			// takes the tag next.
			s.owners.forget(opts.Tag)
		}
		s.finishOperation(ctx, op.ID, out, err)
	})
	if err != nil {
		cancel(nil)
		s.ops.drop(op.ID)
		writeProblem(w, r, err)
		return
	}
	s.claimSnapshot(r, pend.Tag, "") // its id comes when it commits (snapshotOwners.owner)
	noteTargets(r, op.ID, pend.Tag)
	w.Header().Set("Location", "/v1/snapshots/"+pend.Tag)
	writeRecorded(w, r, claim, http.StatusAccepted, apiv1.BranchResponse{Snapshot: s.pendingView(r, pend), Operation: &op})
}

// branchResponse renders a finished branch for p.
func (s *Server) branchResponse(p auth.Principal, res *sandbox.BranchResult) apiv1.BranchResponse {
	return apiv1.BranchResponse{
		Snapshot:    s.snapshotInfoFor(p, res.Snapshot),
		PauseMillis: ms(res.Paused.Microseconds()), BytesWritten: res.BytesWritten,
		TotalMillis: ms(res.Duration.Microseconds()),
	}
}

// leftNoTag reports whether nothing holds tag: no snapshot, no pending or
// failed branch.
func (s *Server) leftNoTag(tag string) bool {
	if _, ok := s.Engine.Pending(tag); ok {
		return false
	}
	_, err := s.Engine.Store().Get(tag)
	return errdefs.IsNotFound(err)
}
