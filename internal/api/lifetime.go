package api

import (
	"net/http"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// DefaultSandboxTimeout is a sandbox's lifetime when neither its fork nor
// the daemon's configuration (forkd serve --sandbox-timeout) names one: a
// leaked sandbox is reclaimed within the hour. The SDKs ask for less by
// default (five minutes, as E2B).
const DefaultSandboxTimeout = time.Hour

// forkTimeout is the lifetime a fork asks for: its timeout_s, or the
// daemon's default when absent (0 stays 0: no limit).
func (s *Server) forkTimeout(seconds *int64) time.Duration {
	if seconds == nil {
		return s.DefaultTimeout
	}
	return secondsOf(*seconds)
}

// secondsOf converts a wire count of seconds, saturating where a
// Duration would overflow: the engine refuses the result as over its
// limit instead of seeing a wrapped, negative one.
func secondsOf(n int64) time.Duration {
	const most = int64(1<<63-1) / int64(time.Second)
	if n > most || n < -most {
		return time.Duration(most) * time.Second
	}
	return time.Duration(n) * time.Second
}

// patchSandbox changes a running sandbox's lifetime: a new timeout counts
// from now (E2B's set_timeout), a new idle timeout replaces the old. The
// audit record notes what was set.
func (s *Server) patchSandbox(w http.ResponseWriter, r *http.Request) {
	var req apiv1.SandboxPatch
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	var l sandbox.Lifetime
	if req.TimeoutSeconds != nil {
		d := secondsOf(*req.TimeoutSeconds)
		l.Timeout = &d
		noteTargets(r, "timeout="+d.String())
	}
	if req.IdleTimeoutSeconds != nil {
		d := secondsOf(*req.IdleTimeoutSeconds)
		l.IdleTimeout = &d
		noteTargets(r, "idle_timeout="+d.String())
	}
	sb, err := s.Engine.SetLifetime(r.PathValue("id"), l)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, sandboxInfo(sb))
}
