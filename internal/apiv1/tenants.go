package apiv1

// Tenant is GET /v1/tenants/{tenant}: a tenant's quota and what its
// sandboxes hold now.
type Tenant struct {
	Name string `json:"name"`
	// Quota is the quota that applies: the tenant's own, or the default
	// one (QuotaDefault is then true); zero fields set no bound.
	Quota        Quota `json:"quota"`
	QuotaDefault bool  `json:"quota_default,omitempty"`
	// Usage counts the tenant's running and starting sandboxes, the guest
	// memory they commit and its builds running, as the quota does.
	Usage TenantUsage `json:"usage"`
}

// Quota bounds a tenant's sandboxes and builds (PUT
// /v1/tenants/{tenant}/quota). 0: no bound. Admins are never held to a
// quota.
type Quota struct {
	MaxSandboxes int   `json:"max_sandboxes"`
	MaxMemoryMiB int64 `json:"max_memory_mib"`
	// MaxBuilds bounds the tenant's image builds and snapshot creations
	// at once. 0: none of its own; the daemon then lets it take all but
	// one of its --max-builds slots (at least one). Omitted when 0, so
	// that a client can still set the other bounds on an older daemon.
	MaxBuilds int `json:"max_builds,omitempty"`
}

// TenantUsage is what a tenant's sandboxes hold.
type TenantUsage struct {
	Sandboxes int   `json:"sandboxes"`
	MemoryMiB int64 `json:"memory_mib"`
	// Builds counts its image builds and snapshot creations running.
	Builds int `json:"builds"`
}

// QuotaDefaultTenant, as the {tenant} of PUT /v1/tenants/{tenant}/quota,
// sets the quota of every tenant without one of its own.
const QuotaDefaultTenant = "*"

// ShareAll, in a snapshot's SharedWith (PUT
// /v1/snapshots/{tag}/shares/*), shares it with every tenant.
const ShareAll = "*"
