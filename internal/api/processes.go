package api

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
)

// Process control: the running execs of a sandbox, by the guest pid the
// exec reported (its start event, its X-Forkd-Pid header). A process is
// reachable from its start until it exits; the exec's own stream stays
// its lifeline (closing it kills the process group).

// listProcesses answers the sandbox's running execs.
func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	list, err := agent.Processes(r.Context())
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	if list == nil {
		list = []apiv1.ProcessInfo{}
	}
	writeJSON(w, list)
}

// processStdin appends the raw body to the stdin of an exec started with
// stdin_open, then closes that stdin when ?close=true. It answers once the
// guest pipe took every byte, so a process that does not read holds the
// request (the daemon buffers nothing of it).
func (s *Server) processStdin(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPid(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	closeStdin, err := httpquery.Bool(r.URL.Query(), "close", false)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	// Held for the whole write: the sandbox counts as busy (no idle
	// timeout) while a slow reader takes its stdin.
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	var body io.Reader
	if r.ContentLength != 0 {
		body = r.Body
	}
	if err := agent.WriteStdin(r.Context(), pid, body, closeStdin); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// signalProcess sends a signal (SignalRequest; an empty body is SIGKILL) to
// the process group of an exec.
func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPid(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	var req apiv1.SignalRequest
	if r.ContentLength != 0 {
		// An empty body means SIGKILL, also when it comes chunked (no
		// Content-Length): look before decoding.
		br := bufio.NewReader(r.Body)
		if _, err := br.Peek(1); err == nil {
			r.Body = struct {
				io.Reader
				io.Closer
			}{br, r.Body}
			if err := decode(w, r, &req); err != nil {
				writeProblem(w, r, err)
				return
			}
		}
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	if err := agent.Signal(r.Context(), pid, strings.TrimSpace(req.Signal)); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pathPid reads the path's {pid}: a guest pid an exec reported.
func pathPid(r *http.Request) (int, error) {
	s := r.PathValue("pid")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("process id %q: want the positive pid an exec reported (its start event): %w", s, errdefs.ErrInvalidArgument)
	}
	return pid, nil
}
