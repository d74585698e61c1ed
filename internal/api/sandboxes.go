package api

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// The sandbox routes: list, fork, get, kill (lifetime.go changes a
// sandbox's lifetime; exec, run_code and files have their own files).

// listSandboxes lists the sandboxes the caller may see, filtered by tag,
// state and labels, a page at a time (paging.go), oldest first.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	out := []apiv1.Sandbox{}
	tag := r.URL.Query().Get("tag")
	state := r.URL.Query().Get("state")
	if state != "" && !slices.Contains(apiv1.SandboxStates, state) {
		writeProblem(w, r, fmt.Errorf("state filter %q: want one of %s: %w",
			state, strings.Join(apiv1.SandboxStates, ", "), errdefs.ErrInvalidArgument))
		return
	}
	labels := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeProblem(w, r, fmt.Errorf("label filter %q: want key=value: %w", l, errdefs.ErrInvalidArgument))
			return
		}
		labels[k] = v
	}
	p := s.principalOf(r)
	for _, sb := range s.Engine.List() {
		if !p.Sees(sb.Tenant) || !sb.MatchLabels(labels) {
			continue
		}
		info := sandboxInfo(sb)
		if (tag != "" && info.Tag != tag) || (state != "" && info.State != state) {
			continue
		}
		out = append(out, info)
	}
	writePage(w, r, out, sandboxOrder)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req apiv1.ForkRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if err := oci.CheckForkSource(req.Tag); err != nil {
		writeProblem(w, r, err)
		return
	}
	if err := checkPullPolicy(req); err != nil {
		writeProblem(w, r, err)
		return
	}
	claim, ok := s.claimIdempotency(w, r, req, nil)
	if !ok {
		return
	}
	defer claim.release()
	if oci.IsReference(req.Tag) {
		// The reference's snapshot, pulled for this tenant (forkref.go).
		tag, err := s.forkReference(r, req)
		if err != nil {
			writeProblem(w, r, err)
			return
		}
		req.Tag = tag
	}
	p := s.principalOf(r)
	opts := sandbox.ForkOptions{
		Tag: req.Tag, Count: req.Count, Labels: req.Metadata, RequestID: requestID(r), Network: policyOf(req.Network),
		Timeout:     s.forkTimeout(req.TimeoutSeconds),
		IdleTimeout: secondsOf(req.IdleTimeoutSeconds),
		Tenant:      auth.TenantOf(p.Tenant),
	}
	if req.CPUs != 0 {
		if !(req.CPUs > 0 && req.CPUs <= 1000) {
			writeProblem(w, r, fmt.Errorf("cpus %g: want a number of CPUs from 0.1 to the snapshot's vCPUs: %w", req.CPUs, errdefs.ErrInvalidArgument))
			return
		}
		opts.CPUMillicores = max(1, int64(math.Round(req.CPUs*1000)))
	}
	if !p.Admin() {
		// Its own snapshots and those shared with it; quota-bound.
		if err := s.checkSnapshot(p, req.Tag, false); err != nil {
			writeProblem(w, r, err)
			return
		}
		opts.Quota = s.quotaOf(opts.Tenant)
	}
	start := time.Now()
	sbs, err := s.Engine.ForkWith(r.Context(), opts)
	if err != nil {
		writeProblem(w, r, s.scopeSnapshotErr(p, req.Tag, err))
		return
	}
	resp := apiv1.ForkResponse{TotalMillis: float64(time.Since(start).Microseconds()) / 1000}
	for _, sb := range sbs {
		resp.Sandboxes = append(resp.Sandboxes, sandboxInfo(sb))
		noteTargets(r, sb.ID)
	}
	writeRecorded(w, r, claim, http.StatusCreated, resp)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.Engine.Get(r.PathValue("id"))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	info := sandboxInfo(sb)
	info.Network = sb.NetworkInfo(true)
	writeJSON(w, info)
}

// sandboxInfo renders a sandbox, one recorded before tenants as the
// default tenant's.
func sandboxInfo(sb *sandbox.Sandbox) apiv1.Sandbox {
	info := sb.Info()
	info.Tenant = auth.TenantOf(info.Tenant)
	return info
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	// Engine.Get's error for a missing one: the one authorize gives for
	// another tenant's.
	if _, err := s.Engine.Get(r.PathValue("id")); err != nil {
		writeProblem(w, r, err)
		return
	}
	if _, err := s.Engine.Kill(r.Context(), []string{r.PathValue("id")}); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	var req apiv1.KillRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if req.All == (len(req.IDs) > 0) {
		writeProblem(w, r, fmt.Errorf("give either sandbox ids or all=true: %w", errdefs.ErrInvalidArgument))
		return
	}
	var killed []string
	var err error
	switch p := s.principalOf(r); {
	case !p.Admin():
		killed, err = s.killOwn(r.Context(), p, req)
	case req.All:
		killed = s.Engine.KillAll(r.Context())
	default:
		killed, err = s.Engine.Kill(r.Context(), req.IDs)
	}
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	if killed == nil {
		killed = []string{}
	}
	noteTargets(r, killed...)
	writeJSON(w, apiv1.KillResponse{Killed: killed})
}
