package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Authorization: who may call which route, on which objects.
//
// auth.Middleware says who a request is (an auth.Principal: token name,
// role, tenant; the Unix socket is an admin). authorize, inside it, says
// whether that principal may run the route: each route pattern has a
// policy (routePolicies) naming the least role it needs and what its path
// names. A role too weak is 403 (permission_denied) naming the role
// needed; an object of another tenant, named in the path, is 404 with the
// same message as a missing one, so that tenants cannot learn of each
// other's sandboxes, snapshots or operations. Listings are filtered by the
// handlers, and objects named in bodies (fork's tag, kill's ids) checked
// there. Admins pass every check. docs/SECURITY.md lists the decisions.

// access is the least role a route needs.
type access int

const (
	public    access = iota // no principal (healthz, and the catch-all's 404/405)
	reader                  // every role: admin, user, read-only
	writer                  // admin and user
	adminOnly               // admin
)

// scope is what a route's path names, checked against the principal's
// tenant before the handler runs.
type scope int

const (
	noScope        scope = iota
	sandboxScope         // {id}: a sandbox of the caller's tenant
	snapshotSeen         // {tag}: a snapshot the caller's tenant owns, or one shared with it
	snapshotOwned        // {tag}: a snapshot the caller's tenant owns
	operationScope       // {id}: an operation of the caller's tenant
	tenantScope          // {tenant}: the caller's own tenant
)

type policy struct {
	access access
	scope  scope
}

// routePolicies is the policy of every route the Handler registers
// (TestEveryRouteHasAPolicy keeps it complete). A pattern missing here is
// admin-only: a new route is closed until someone decides.
var routePolicies = map[string]policy{
	"":                {public, noScope}, // the mux's own redirects (path cleaning)
	"/":               {public, noScope},
	"GET /v1/healthz": {public, noScope},

	"GET /v1/version":      {reader, noScope},
	"GET /v1/info":         {reader, noScope},
	"GET /v1/openapi.json": {reader, noScope},
	"GET /v1/doctor":       {adminOnly, noScope},
	"GET /metrics":         {adminOnly, noScope},
	"GET /v1/images":       {adminOnly, noScope},
	"POST /v1/images":      {adminOnly, noScope},
	// Images and the daemon's disk are shared by every tenant.
	"DELETE /v1/images/{digest}": {adminOnly, noScope},
	"GET /v1/system/df":          {adminOnly, noScope},
	"POST /v1/system/prune":      {adminOnly, noScope},

	"GET /v1/events":          {reader, noScope}, // filtered by tenant (feed.go)
	"GET /v1/operations":      {reader, noScope},
	"GET /v1/operations/{id}": {reader, operationScope},

	"GET /v1/operations/{id}/events":  {reader, operationScope},
	"POST /v1/operations/{id}/cancel": {writer, operationScope},

	"GET /v1/tenants":                {reader, noScope},
	"GET /v1/tenants/{tenant}":       {reader, tenantScope},
	"PUT /v1/tenants/{tenant}/quota": {adminOnly, noScope},

	"GET /v1/snapshots":                          {reader, noScope},
	"POST /v1/snapshots":                         {writer, noScope},
	"POST /v1/snapshots/import":                  {writer, noScope}, // ?force: admin (importArchive)
	"POST /v1/snapshots/pull":                    {writer, noScope}, // force: admin (pullSnapshot)
	"GET /v1/snapshots/{tag}":                    {reader, snapshotSeen},
	"DELETE /v1/snapshots/{tag}":                 {writer, snapshotOwned},
	"GET /v1/snapshots/{tag}/archive":            {reader, snapshotOwned},
	"POST /v1/snapshots/{tag}/compact":           {writer, snapshotOwned},
	"PUT /v1/snapshots/{tag}/shares/{tenant}":    {writer, snapshotOwned},
	"DELETE /v1/snapshots/{tag}/shares/{tenant}": {writer, snapshotOwned},

	"GET /v1/sandboxes":       {reader, noScope},
	"POST /v1/sandboxes":      {writer, noScope}, // the tag: fork
	"POST /v1/sandboxes/kill": {writer, noScope}, // the ids: kill

	"GET /v1/sandboxes/{id}":                           {reader, sandboxScope},
	"DELETE /v1/sandboxes/{id}":                        {writer, sandboxScope},
	"PATCH /v1/sandboxes/{id}":                         {writer, sandboxScope},
	"POST /v1/sandboxes/{id}/exec":                     {writer, sandboxScope},
	"GET /v1/sandboxes/{id}/processes":                 {reader, sandboxScope},
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin":    {writer, sandboxScope},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal":   {writer, sandboxScope},
	"POST /v1/sandboxes/{id}/processes/{pid}/resize":   {writer, sandboxScope},
	"GET /v1/sandboxes/{id}/exec/ws":                   {writer, sandboxScope}, // a GET that runs a process (execWSPattern)
	"POST /v1/sandboxes/{id}/run_code":                 {writer, sandboxScope},
	"POST /v1/sandboxes/{id}/run_code/stream":          {writer, sandboxScope},
	"POST /v1/sandboxes/{id}/branch":                   {writer, sandboxScope},
	"GET /v1/sandboxes/{id}/network":                   {reader, sandboxScope},
	"PUT /v1/sandboxes/{id}/network":                   {writer, sandboxScope},
	"GET /v1/sandboxes/{id}/ports/{port}":              {reader, sandboxScope}, // a tunnel (Upgrade) needs writer
	"GET /v1/sandboxes/{id}/ports/{port}/{path...}":    {reader, sandboxScope},
	"POST /v1/sandboxes/{id}/ports/{port}/{path...}":   {writer, sandboxScope},
	"PUT /v1/sandboxes/{id}/ports/{port}/{path...}":    {writer, sandboxScope},
	"PATCH /v1/sandboxes/{id}/ports/{port}/{path...}":  {writer, sandboxScope},
	"DELETE /v1/sandboxes/{id}/ports/{port}/{path...}": {writer, sandboxScope},
	"GET /v1/sandboxes/{id}/files":                     {reader, sandboxScope},
	"PUT /v1/sandboxes/{id}/files":                     {writer, sandboxScope},
	"DELETE /v1/sandboxes/{id}/files":                  {writer, sandboxScope},
	"GET /v1/sandboxes/{id}/files/list":                {reader, sandboxScope},
	"GET /v1/sandboxes/{id}/files/stat":                {reader, sandboxScope},
	"POST /v1/sandboxes/{id}/files/mkdir":              {writer, sandboxScope},

	// MCP is a transport: each tool call is a REST request through this
	// same Handler (mcp.go), authorized as such.
	"POST /mcp":   {reader, noScope},
	"GET /mcp":    {reader, noScope},
	"DELETE /mcp": {reader, noScope},
	"/mcp":        {reader, noScope},
}

// principal is who r acts as. Without a token store every client is an
// admin (the daemon then serves only its 0600 Unix socket, as before
// tokens existed); with one, a request auth.Middleware did not
// authenticate (only PublicPath) is nobody.
func (s *Server) principal(r *http.Request) (auth.Principal, bool) {
	if p, ok := auth.PrincipalFrom(r.Context()); ok {
		return p, true
	}
	if s.Tokens == nil {
		return auth.SocketPrincipal, true
	}
	return auth.Principal{}, false
}

// principalOf is the principal of a request that authorize let through.
func (s *Server) principalOf(r *http.Request) auth.Principal {
	p, _ := s.principal(r)
	return p
}

// actFor makes a request that names a tenant in auth.ActForHeader act
// for it (auth.Principal.ActFor): only an admin may, for another tenant
// than its own, with one header; anything else is refused (403, 400).
// The header is dropped, so it never reaches a guest through the port
// proxy.
func (s *Server) actFor(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		values := r.Header.Values(auth.ActForHeader)
		r.Header.Del(auth.ActForHeader)
		if len(values) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		p, ok := s.principal(r)
		if !ok { // no token: authorize answers 401
			next.ServeHTTP(w, r)
			return
		}
		acting, err := p.ActFor(values[0])
		if len(values) > 1 {
			err = fmt.Errorf("%d %s headers: send one: %w", len(values), auth.ActForHeader, errdefs.ErrInvalidArgument)
		}
		if err != nil {
			// Recorded as this token's refused request, not as an
			// anonymous one.
			if n, _ := r.Context().Value(auditKey{}).(*auditNote); n != nil {
				n.passedAs(p)
			}
			writeProblem(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), acting)))
	})
}

// authorize runs each request's route policy (see above), then mux.
func (s *Server) authorize(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := mux.Handler(r)
		pol, ok := routePolicies[pattern]
		if !ok {
			pol = policy{access: adminOnly}
		}
		if pol.access == public {
			mux.ServeHTTP(w, r)
			return
		}
		p, ok := s.principal(r)
		if !ok {
			writeProblem(w, r, fmt.Errorf("%s %s needs a bearer token: %w", r.Method, r.URL.Path, errdefs.ErrUnauthenticated))
			return
		}
		r = r.WithContext(auth.WithPrincipal(r.Context(), p))
		if err := s.permit(r, p, pattern, pol); err != nil {
			writeProblem(w, r, err)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// permit checks p's role against the route's, then the object its path
// names against p's tenant.
func (s *Server) permit(r *http.Request, p auth.Principal, pattern string, pol policy) error {
	need := pol.access
	if need < writer && r.Header.Get("Upgrade") != "" {
		need = writer // a tunnel or WebSocket is two-way
	}
	route := pattern
	if route == "" || route == "/" || !strings.Contains(route, " ") {
		route = r.Method + " " + r.URL.Path
	}
	switch {
	case need == adminOnly && !p.Admin():
		return roleError(p, route, "the admin role")
	case need == writer && !p.CanWrite():
		return roleError(p, route, "the user or admin role")
	}
	if p.Admin() || pol.scope == noScope {
		return nil
	}
	path := r.URL.EscapedPath()
	switch pol.scope {
	case sandboxScope:
		return s.checkSandbox(p, pathValue(pattern, path, "id"))
	case snapshotSeen, snapshotOwned:
		return s.checkSnapshot(p, pathValue(pattern, path, "tag"), pol.scope == snapshotOwned)
	case operationScope:
		id := pathValue(pattern, path, "id")
		if op, ok := s.ops.get(id); ok && !p.Sees(op.Tenant) {
			return errNoOperation(id)
		}
	case tenantScope:
		if t := pathValue(pattern, path, "tenant"); t != auth.TenantOf(p.Tenant) {
			return fmt.Errorf("no tenant %q: %s sees only its own, %q: %w", t, p, auth.TenantOf(p.Tenant), errdefs.ErrNotFound)
		}
	}
	return nil
}

// roleError is the 403 of a principal whose role is too weak for route.
func roleError(p auth.Principal, route, needs string) error {
	return fmt.Errorf("%s may not call %s: it needs %s; ask an admin for such a token (`forkd token create NAME --role user --tenant %s`): %w",
		p, route, needs, auth.TenantOf(p.Tenant), errdefs.ErrPermissionDenied)
}

// checkSandbox refuses a sandbox of another tenant as if it did not
// exist. A missing one passes: the handler says so.
func (s *Server) checkSandbox(p auth.Principal, id string) error {
	if sb, err := s.Engine.Get(id); err == nil && !p.Sees(sb.Tenant) {
		return errNoSandbox(id)
	}
	return nil
}

// errNoSandbox is the engine's own not-found error (Engine.Get), so that
// a hidden sandbox and a missing one read the same.
func errNoSandbox(id string) error {
	return fmt.Errorf("no sandbox %q (list them with `forkd ls`): %w", id, errdefs.ErrNotFound)
}

// errNoOperation is getOperation's not-found error.
func errNoOperation(id string) error {
	return fmt.Errorf("no operation %q (operations are kept while the daemon runs): %w", id, errdefs.ErrNotFound)
}

// checkSnapshot refuses a tag p cannot see as if it did not exist (even
// a missing one: the store's own not-found error lists every tag), and,
// when owned, a tag shared with p's tenant that it does not own with 403.
func (s *Server) checkSnapshot(p auth.Principal, tag string, owned bool) error {
	a := s.snapshotAccess(p, tag)
	switch {
	case !a.exists || !a.seen:
		return s.snapshotNotFound(p, tag)
	case owned && !a.owned:
		return fmt.Errorf("snapshot %q belongs to tenant %q, which shares it with yours read-only: %s may see and fork it, not remove, export, compact or re-share it: %w",
			tag, a.owner, p, errdefs.ErrPermissionDenied)
	}
	return nil
}

// pathValue extracts the {name} wildcard of pattern from path, the
// request's escaped path, unescaped as ServeMux does (see pathTargets).
func pathValue(pattern, path, name string) string {
	_, p, _ := strings.Cut(pattern, " ")
	ps, xs := strings.Split(p, "/"), strings.Split(path, "/")
	for i, seg := range ps {
		if seg == "{"+name+"}" && i < len(xs) {
			if v, err := url.PathUnescape(xs[i]); err == nil {
				return v
			}
			return xs[i]
		}
	}
	return ""
}
