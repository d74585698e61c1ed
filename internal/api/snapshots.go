package api

import (
	"encoding/json"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/httpquery"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// chainInfo fills in where a snapshot sits in its chain.
func (s *Server) chainInfo(snap *snapshot.Snapshot, out *apiv1.Snapshot) {
	out.Depth = snap.Depth
	if snap.Parent != nil {
		out.Parent = &apiv1.ParentRef{Tag: snap.Parent.Tag, Digest: snap.Parent.Digest}
		out.Ancestors = s.Engine.Store().Ancestors(snap)
		// A layer whose chain broke (an ancestor removed with --force, or
		// replaced) cannot be forked: say so where clients look.
		if _, err := s.Engine.Store().Chain(snap); err != nil {
			out.State, out.Error = apiv1.SnapshotFailed, err.Error()
		}
	}
	if deps, err := s.Engine.Store().Dependents(snap.Tag); err == nil && len(deps) > 0 {
		out.Dependents = deps
	}
	// A file changed since it was written (stamps differ): forks are
	// refused, so clients see it as failed, with the reason.
	if out.State != apiv1.SnapshotFailed {
		if err := s.Engine.SnapshotIntact(snap); err != nil {
			out.State, out.Error = apiv1.SnapshotFailed, err.Error()
		}
	}
}

// deleteSnapshot removes a tag; ?cascade=true also removes the layers
// built on it, ?force=true removes it alone (its layers stop working). It
// answers with every tag it removed.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	var opts sandbox.RemoveOptions
	for name, dst := range map[string]*bool{"cascade": &opts.Cascade, "force": &opts.Force} {
		b, err := httpquery.Bool(r.URL.Query(), name, false)
		if err != nil {
			writeProblem(w, r, err)
			return
		}
		*dst = b
	}
	removed, err := s.Engine.RemoveSnapshotWith(r.Context(), r.PathValue("tag"), opts)
	noteTargets(r, removed...)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, apiv1.RemovedSnapshots{Removed: removed})
}

// compactSnapshot writes a flat copy of a chain head under a new tag.
func (s *Server) compactSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CompactRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	snap, err := s.Engine.Compact(r.Context(), r.PathValue("tag"), req.To)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	noteTargets(r, snap.Tag)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(s.snapshotInfo(snap))
}

// pendingInfo describes a tag a background branch is writing (or failed
// to write): only its tag, state and error are known.
func pendingInfo(p sandbox.PendingSnapshot) apiv1.Snapshot {
	out := apiv1.Snapshot{Tag: p.Tag, Created: p.Started.UTC(), State: apiv1.SnapshotWriting, Files: map[string]apiv1.FileEntry{}}
	if p.State == sandbox.PendingFailed {
		out.State = apiv1.SnapshotFailed
		if p.Err != nil {
			out.Error = p.Err.Error()
		}
	}
	return out
}
