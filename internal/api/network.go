package api

import (
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/egress"
)

// policyOf is the engine's form of a wire policy (nil stays nil: inherit).
func policyOf(p *apiv1.NetworkPolicy) *egress.Policy {
	if p == nil {
		return nil
	}
	return &egress.Policy{Mode: egress.Mode(p.Mode), Allow: p.Allow, MaxConnections: p.MaxConnections, RateMbit: p.RateMbit}
}

// getNetwork answers a sandbox's policy and traffic counters.
func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	sb, err := s.Engine.Get(r.PathValue("id"))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, sb.NetworkInfo(true))
}

// putNetwork changes a running sandbox's egress policy. The audit record
// names the sandbox and the policy set.
func (s *Server) putNetwork(w http.ResponseWriter, r *http.Request) {
	var req apiv1.NetworkPolicy
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	p := policyOf(&req)
	if _, err := s.Engine.SetNetwork(r.PathValue("id"), *p); err != nil {
		writeProblem(w, r, err)
		return
	}
	noteTargets(r, "network="+p.String())
	sb, err := s.Engine.Get(r.PathValue("id"))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, sb.NetworkInfo(true))
}
