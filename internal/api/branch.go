package api

import (
	"encoding/json"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

func ms(us int64) float64 { return float64(us) / 1000 }

// branch snapshots a running sandbox into a new tag (201 with the snapshot
// and the pause the source saw).
func (s *Server) branch(w http.ResponseWriter, r *http.Request) {
	var req apiv1.BranchRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	opts := sandbox.BranchOptions{Tag: req.Tag, Mode: req.Mode}
	if req.NoWait {
		// 202: the tag is "writing" until the background branch commits it.
		p, err := s.Engine.BranchAsync(r.PathValue("id"), opts)
		if err != nil {
			writeProblem(w, r, err)
			return
		}
		s.claimSnapshot(r, p.Tag, "") // its id comes when it commits (snapshotOwners.owner)
		noteTargets(r, p.Tag)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/snapshots/"+p.Tag)
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(apiv1.BranchResponse{Snapshot: s.pendingView(r, p)})
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
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(apiv1.BranchResponse{
		Snapshot:    s.snapshotInfo(r, res.Snapshot),
		PauseMillis: ms(res.Paused.Microseconds()), BytesWritten: res.BytesWritten,
		TotalMillis: ms(res.Duration.Microseconds()),
	})
}
