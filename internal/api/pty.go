package api

import (
	"fmt"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// checkExec validates what the daemon checks of an exec request before
// the agent sees it (POST .../exec and the exec WebSocket).
func checkExec(req apiv1.ExecRequest) error {
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return fmt.Errorf("exec needs exactly one of argv or shell: %w", errdefs.ErrInvalidArgument)
	}
	if req.PTY != nil {
		return checkPTY(*req.PTY)
	}
	return nil
}

// checkPTY validates a terminal size ("pty cols 0: want 1..1000").
func checkPTY(p apiv1.PTY) error {
	if msg := p.Check(); msg != "" {
		return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
	}
	return nil
}

// resizeProcess sets the terminal size (ResizeRequest) of an exec started
// with pty; the guest's kernel sends SIGWINCH to its foreground group.
func (s *Server) resizeProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPid(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	var req apiv1.ResizeRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if err := checkPTY(req); err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	if err := agent.Resize(r.Context(), pid, req); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
