package handler

import (
	"fmt"
	"net/http"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/changes"
)

// agentWrites are the files the agent itself writes in every guest (its
// identity); they are never part of a build step's layer.
var agentWrites = map[string]bool{"etc/hostname": true, "etc/hosts": true, "etc/resolv.conf": true}

// handleChanges streams the overlay's upper directory as an OCI layer.
// A failure after the first byte aborts the response, so the host sees a
// cut stream (an unexpected EOF), never a short archive that looks whole.
func (a *Agent) handleChanges(w http.ResponseWriter, r *http.Request) {
	if a.cfg.ChangesDir == "" {
		writeProblem(w, fmt.Errorf("the root file system is not an overlay (no disk): nothing to export: %w", errdefs.ErrFailedPrecondition))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	n, err := changes.Write(w, a.cfg.ChangesDir, func(rel string) bool { return agentWrites[rel] })
	if err != nil {
		a.cfg.Logf("changes: exporting after %d bytes of content: %v", n, err)
		panic(http.ErrAbortHandler)
	}
}
