package api

import (
	"net/http"
	"sort"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// APIVersion is the version of the API's paths (/v1/...).
const APIVersion = "v1"

// features lists what every daemon of this build offers; info adds those
// that depend on its configuration.
var features = []string{
	"branch.diff", "branch.full", "events", "exec", "exec.websocket", "files", "fork", "lifetimes",
	"idempotency", "images.remove", "mcp", "metrics", "network.egress", "operations", "operations.cancel", "pack", "ports", "processes", "pty", "run_code",
	"system.df", "system.prune",
}

// info serves GET /v1/info.
func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	cfg := s.Engine.Config()
	d := s.Engine.Driver()
	v, _ := d.Version(r.Context())
	p := s.principalOf(r)
	out := apiv1.Info{
		Version: s.Version, APIVersion: APIVersion, VMM: d.Name(), VMMVersion: v, Accel: string(cfg.Accel),
		Features: append([]string(nil), features...),
		Limits: apiv1.InfoLimits{
			MaxForkCount: cfg.MaxForkCount, MaxSandboxes: cfg.MaxSandboxes, PoolSize: cfg.PoolSize,
			MaxTimeoutSeconds:     int64(sandbox.MaxTimeout / time.Second),
			DefaultTimeoutSeconds: int64(s.DefaultTimeout / time.Second),
			DeadRetentionSeconds:  int64(cfg.DeadRetention / time.Second),
		},
		Caller: apiv1.InfoCaller{Tenant: auth.TenantOf(p.Tenant), Role: string(p.Role)},
	}
	if cfg.MemoryDir != "" {
		out.Features = append(out.Features, "branch.live")
	}
	if s.Tokens != nil {
		out.Features = append(out.Features, "tenants")
	}
	if len(s.TrustedKeys) > 0 {
		out.Features = append(out.Features, "import.signed_only")
	}
	if s.PortDomain != "" {
		out.Features = append(out.Features, "ports.domain")
	}
	if p.Role == auth.RoleAdmin {
		c, err := s.capacity()
		if err != nil && s.Log != nil {
			s.Log.Warn("GET /v1/info: capacity incomplete", "err", err)
		}
		out.Capacity = c
	}
	sort.Strings(out.Features)
	writeJSON(w, out)
}
