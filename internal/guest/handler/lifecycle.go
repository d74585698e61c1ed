package handler

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// handleQuiesce answers, then ends the session it came on, so the host can
// snapshot the VM with the agent waiting for the next HELLO.
func (a *Agent) handleQuiesce(w http.ResponseWriter, r *http.Request) {
	// A complete response with a Content-Length: nothing is left to write
	// once the session ends. Connection: close, so the host does not keep
	// the stream for another request (which would be refused).
	w.Header().Set("Connection", "close")
	writeJSON(w, struct{}{})
	if err := agentconn.EndSession(w, r); err != nil && !errors.Is(err, agentconn.ErrNoSession) {
		a.cfg.Logf("quiesce: %v", err)
	}
}

// handleShutdown answers, then powers the VM off.
func (a *Agent) handleShutdown(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Shutdown == nil {
		writeProblem(w, fmt.Errorf("this agent cannot power off its machine (not PID 1): %w", errdefs.ErrNotImplemented))
		return
	}
	writeJSON(w, struct{}{})
	_ = http.NewResponseController(w).Flush()
	a.cfg.Logf("shutdown requested by the host")
	go a.cfg.Shutdown()
}
