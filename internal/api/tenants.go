package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// Tenants and their quotas. A tenant is a name that tokens act for
// (auth.Principal); its quota (auth.Quota, kept in the token store) bounds
// its sandboxes and builds, and admins, who are the operator, are held to
// none.

// quotaOf is the quota that applies to tenant: its own, else the default,
// else none (and none without a token store).
func (s *Server) quotaOf(tenant string) sandbox.TenantQuota {
	if s.Tokens == nil {
		return sandbox.TenantQuota{}
	}
	q, _ := s.Tokens.QuotaOf(tenant)
	return sandbox.TenantQuota{MaxSandboxes: q.MaxSandboxes, MaxMemoryMiB: q.MaxMemoryMiB, MaxBuilds: q.MaxBuilds}
}

// buildOwner is whom a build r asks for runs for: an admin's is the
// operator's (tenant "", held to --max-builds only); anyone else's is its
// tenant's, bound by its quota's max_builds or, without one, by the
// engine's fairness rule (sandbox/builds.go).
func (s *Server) buildOwner(r *http.Request) (tenant string, q sandbox.TenantQuota) {
	p := s.principalOf(r)
	if p.Admin() {
		return "", sandbox.TenantQuota{}
	}
	tenant = auth.TenantOf(p.Tenant)
	return tenant, s.quotaOf(tenant)
}

// tenantInfo renders one tenant: its quota and what its sandboxes hold.
func (s *Server) tenantInfo(name string) apiv1.Tenant {
	out := apiv1.Tenant{Name: name}
	if s.Tokens != nil {
		q, own := s.Tokens.QuotaOf(name)
		out.Quota = apiv1.Quota{MaxSandboxes: q.MaxSandboxes, MaxMemoryMiB: q.MaxMemoryMiB, MaxBuilds: q.MaxBuilds}
		out.QuotaDefault = !own && name != apiv1.QuotaDefaultTenant && !q.IsZero()
	}
	if name != apiv1.QuotaDefaultTenant {
		u := s.Engine.TenantUsage(name)
		out.Usage = apiv1.TenantUsage{Sandboxes: u.Sandboxes, MemoryMiB: u.MemoryMiB, Builds: u.Builds}
	}
	return out
}

// listTenants lists the tenants the token store knows (and the default
// tenant) for an admin; any other principal sees its own tenant only. A
// page at a time (paging.go): the default tenant first, then by name.
func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) {
	p := s.principalOf(r)
	names := []string{auth.TenantOf(p.Tenant)}
	if p.Admin() {
		seen := map[string]bool{auth.DefaultTenant: true}
		names = []string{auth.DefaultTenant}
		if s.Tokens != nil {
			for _, t := range s.Tokens.Tenants() {
				if !seen[t] {
					seen[t] = true
					names = append(names, t)
				}
			}
		}
	}
	out := make([]apiv1.Tenant, 0, len(names))
	for _, n := range names {
		out = append(out, s.tenantInfo(n))
	}
	writePage(w, r, out, tenantOrder)
}

// getTenant shows one tenant (authorize lets a non-admin ask for its own
// only). "*" is the default quota.
func (s *Server) getTenant(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("tenant")
	if err := validTenantArg(name); err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, s.tenantInfo(name))
}

// putQuota sets a tenant's quota ("*": the default for tenants without
// one; all zero: remove it). Values out of range are a 400 naming the
// bound. Admin only.
func (s *Server) putQuota(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("tenant")
	if err := validTenantArg(name); err != nil {
		writeProblem(w, r, err)
		return
	}
	var req apiv1.Quota
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if s.Tokens == nil {
		writeProblem(w, r, fmt.Errorf("quotas are kept in the token store, and this daemon has none: create tokens for the tenants (`forkd token create NAME --tenant T`): %w", errdefs.ErrFailedPrecondition))
		return
	}
	if err := s.Tokens.SetQuota(name, auth.Quota{MaxSandboxes: req.MaxSandboxes, MaxMemoryMiB: req.MaxMemoryMiB, MaxBuilds: req.MaxBuilds}); err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, s.tenantInfo(name))
}

// validTenantArg checks a {tenant} path value: a tenant name, or "*".
func validTenantArg(name string) error {
	if name == apiv1.QuotaDefaultTenant {
		return nil
	}
	return auth.ValidateTenant(name)
}

// killOwn is kill for a principal that is not an admin: all=true kills
// its tenant's sandboxes; ids of other tenants' sandboxes are unknown,
// reported (after the others are killed) as missing ones are.
func (s *Server) killOwn(ctx context.Context, p auth.Principal, req apiv1.KillRequest) ([]string, error) {
	var ids, unknown []string
	if req.All {
		for _, sb := range s.Engine.List() {
			if p.Sees(sb.Tenant) {
				ids = append(ids, sb.ID)
			}
		}
	}
	for _, id := range req.IDs {
		if sb, err := s.Engine.Get(id); err == nil && p.Sees(sb.Tenant) {
			ids = append(ids, id)
		} else {
			unknown = append(unknown, id)
		}
	}
	killed, err := s.Engine.Kill(ctx, ids)
	if err == nil && len(unknown) > 0 {
		// As Engine.Kill words it, so hidden and missing ids read the same.
		err = fmt.Errorf("no sandbox %s (list them with `forkd ls`): %w", strings.Join(unknown, ", "), errdefs.ErrNotFound)
	}
	return killed, err
}

// shareSnapshot shares a tag the caller's tenant owns with another tenant
// ("*": every tenant), read-only: it may see and fork it, not remove,
// overwrite, export or re-share it. It answers with the snapshot.
func (s *Server) shareSnapshot(w http.ResponseWriter, r *http.Request) { s.setShare(w, r, true) }

// unshareSnapshot ends a share. Sandboxes and layers the other tenant
// already made from the tag are theirs and keep working.
func (s *Server) unshareSnapshot(w http.ResponseWriter, r *http.Request) { s.setShare(w, r, false) }

func (s *Server) setShare(w http.ResponseWriter, r *http.Request, add bool) {
	tag, tenant := r.PathValue("tag"), r.PathValue("tenant")
	p := s.principalOf(r)
	if tenant != apiv1.ShareAll {
		if err := auth.ValidateTenant(tenant); err != nil {
			writeProblem(w, r, err)
			return
		}
	}
	snap, err := s.Engine.Store().Get(tag)
	if err != nil {
		if _, ok := s.Engine.Pending(tag); ok {
			err = fmt.Errorf("snapshot %q is still being written: share it once it is ready: %w", tag, errdefs.ErrFailedPrecondition)
		}
		writeProblem(w, r, s.scopeSnapshotErr(p, tag, err))
		return
	}
	owner, _ := s.owners.owner(tag, snap.ID)
	if tenant == owner {
		writeProblem(w, r, fmt.Errorf("snapshot %q already belongs to tenant %q: share it with another tenant: %w", tag, tenant, errdefs.ErrInvalidArgument))
		return
	}
	if _, err := s.owners.share(tag, snap.ID, owner, tenant, add); err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, s.snapshotInfo(r, snap))
}
