package api

import (
	"fmt"
	"io/fs"
	"net/http"
	"strconv"

	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
)

// Files inside a sandbox: each route reaches the guest's agent, which does
// the work; paths are the guest's (ValidateGuestPath), never the host's.

func queryPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", fmt.Errorf("missing ?path= (an absolute path inside the sandbox): %w", errdefs.ErrInvalidArgument)
	}
	return p, ValidateGuestPath(p)
}

func parseMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %q: want octal permission bits like 0644: %w", s, errdefs.ErrInvalidArgument)
	}
	return uint32(m), nil
}

// lazyWriter sends the success header on the first byte, so an error that
// happens before any data can still become a problem response.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/octet-stream")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(p)
}

// guestPath is a files request's ?path= and its sandbox's agent; ok is
// false once the problem is answered.
func (s *Server) guestPath(w http.ResponseWriter, r *http.Request) (path string, agent *agentclient.Client, ok bool) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return "", nil, false
	}
	agent = s.agentOf(w, r)
	return path, agent, agent != nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	path, agent, ok := s.guestPath(w, r)
	if !ok {
		return
	}
	lw := &lazyWriter{w: w}
	if _, err := agent.ReadFile(r.Context(), path, lw); err != nil {
		if !lw.started {
			writeProblem(w, r, err)
			return
		}
		// Mid-stream failure: cut the connection so the client cannot take
		// partial content for the whole file.
		panic(http.ErrAbortHandler)
	}
	if !lw.started {
		lw.Write(nil)
	}
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	mode, err := parseMode(r.URL.Query().Get("mode"), 0o644)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	fi, err := agent.WriteFile(r.Context(), path, fs.FileMode(mode), r.Body)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, fi)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	recursive, err := httpquery.Bool(r.URL.Query(), "recursive", false)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	if err := agent.Remove(r.Context(), path, recursive); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	path, agent, ok := s.guestPath(w, r)
	if !ok {
		return
	}
	list, err := agent.ListFiles(r.Context(), path)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, list)
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	path, agent, ok := s.guestPath(w, r)
	if !ok {
		return
	}
	fi, err := agent.Stat(r.Context(), path)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, fi)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req apiv1.MkdirRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if err := ValidateGuestPath(req.Path); err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	fi, err := agent.Mkdir(r.Context(), req)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, fi)
}
