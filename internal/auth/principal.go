package auth

import (
	"context"
	"fmt"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Role is what a token may do. Every token has one; see docs/SECURITY.md
// ("Tenants and tokens") for what each allows route by route.
type Role string

const (
	// RoleAdmin sees and acts on every tenant's objects and alone may use
	// the daemon-wide routes (images, metrics, doctor, quotas, forced
	// imports). The Unix socket, the first token (EnsureFirst) and tokens
	// stored before roles existed are admins.
	RoleAdmin Role = "admin"
	// RoleUser forks, runs and snapshots within its own tenant.
	RoleUser Role = "user"
	// RoleReadOnly may only read (GET) its own tenant's objects.
	RoleReadOnly Role = "read-only"
)

// Roles lists the roles, most powerful first.
var Roles = []Role{RoleAdmin, RoleUser, RoleReadOnly}

// ParseRole checks a role name given by an operator.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("role %q: want one of %s: %w", s, roleNames(), errdefs.ErrInvalidArgument)
}

func roleNames() string {
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// DefaultTenant owns what was created before tenants existed, and is the
// tenant of the Unix socket and of the first token.
const DefaultTenant = "default"

// ValidateTenant checks a tenant name: the syntax of token names.
func ValidateTenant(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("tenant name %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// TenantOf is the tenant an object recorded as owned by tenant belongs
// to: records written before tenants existed (empty) are DefaultTenant's.
func TenantOf(tenant string) string {
	if tenant == "" {
		return DefaultTenant
	}
	return tenant
}

// Principal is who a request acts as: the token's name (empty on the Unix
// socket), its role and its tenant.
type Principal struct {
	Token  string
	Role   Role
	Tenant string
	// Operator is set on an admin acting for a tenant (ActFor): the
	// admin's own tenant, whose snapshots stay visible to it (an
	// operator's base images), though nothing else of that tenant's.
	Operator string
}

// ActForHeader, sent by an admin, makes the request act as a user of the
// tenant it names (Principal.ActFor): what an orchestrator serving many
// tenants through one token sends, e.g. forkd's Kubernetes controller and
// gateway acting for a namespace.
const ActForHeader = "Forkd-Tenant"

// ActFor is p acting for tenant: held to a user's role, tenant and quotas
// as a user token of tenant would be, so what it creates is tenant's and
// it sees only what tenant sees, besides the snapshots of p's own tenant
// (Operator). Only an admin may act, and only for another tenant than
// its own.
func (p Principal) ActFor(tenant string) (Principal, error) {
	if !p.Admin() {
		return Principal{}, fmt.Errorf("%s may not send %s: only an admin token acts for another tenant; drop the header: %w",
			p, ActForHeader, errdefs.ErrPermissionDenied)
	}
	if err := ValidateTenant(tenant); err != nil {
		return Principal{}, fmt.Errorf("%s: %w", ActForHeader, err)
	}
	if tenant == TenantOf(p.Tenant) {
		// It would own what it only sees otherwise: the operator's
		// snapshots, removable by whoever it acts for.
		return Principal{}, fmt.Errorf("%s %q is %s's own tenant: an admin acts only for another (map that tenant to another name, as forkd's Kubernetes controller maps namespace default to k8s.default): %w",
			ActForHeader, tenant, p, errdefs.ErrInvalidArgument)
	}
	return Principal{Token: p.Token, Role: RoleUser, Tenant: tenant, Operator: TenantOf(p.Tenant)}, nil
}

// SocketPrincipal is the identity of a Unix-socket client: the socket's
// 0600 mode lets only root in, so it is an admin of DefaultTenant.
var SocketPrincipal = Principal{Role: RoleAdmin, Tenant: DefaultTenant}

// Admin reports whether p has the admin role.
func (p Principal) Admin() bool { return p.Role == RoleAdmin }

// CanWrite reports whether p may change anything (admin or user).
func (p Principal) CanWrite() bool { return p.Role == RoleAdmin || p.Role == RoleUser }

// Sees reports whether p may see an object owned by tenant (empty: an
// object recorded before tenants existed, DefaultTenant's).
func (p Principal) Sees(tenant string) bool {
	return p.Admin() || TenantOf(tenant) == TenantOf(p.Tenant)
}

// String names p for messages: `token "ci" (user of tenant "acme")`.
func (p Principal) String() string {
	who := "the Unix socket"
	if p.Token != "" {
		who = fmt.Sprintf("token %q", p.Token)
	}
	if p.Operator != "" {
		return fmt.Sprintf("%s (an admin of tenant %q acting as a %s of tenant %q)", who, p.Operator, p.Role, TenantOf(p.Tenant))
	}
	return fmt.Sprintf("%s (%s of tenant %q)", who, p.Role, TenantOf(p.Tenant))
}

type principalKey struct{}

// PrincipalFrom returns who the request authenticated as; ok is false
// when nobody did (PublicPath, or a handler served without Middleware).
func PrincipalFrom(ctx context.Context) (p Principal, ok bool) {
	p, ok = ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithPrincipal returns ctx carrying p, as Middleware does.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// principalOf is the identity a stored token grants.
func principalOf(e Entry) Principal {
	return Principal{Token: e.Name, Role: e.Role, Tenant: e.Tenant}
}
