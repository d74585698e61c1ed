package auth

import (
	"fmt"
	"sort"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Quota bounds what one tenant's sandboxes and builds may hold at once. Zero fields
// set no bound. Quotas live in the token store, next to the tokens that
// define the tenants, so the daemon reloads them as it reloads tokens;
// admins are never held to one (they are the operator).
type Quota struct {
	// MaxSandboxes bounds the tenant's running and starting sandboxes.
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// MaxMemoryMiB bounds the guest memory those sandboxes commit (each
	// guest's full size, as --guest-memory-share counts it).
	MaxMemoryMiB int64 `json:"max_memory_mib,omitempty"`
	// MaxBuilds bounds the tenant's image builds and snapshot creations
	// running at once. 0: no bound of its own, and then the daemon's
	// fairness rule holds it (internal/sandbox/builds.go): a tenant takes
	// at most all but one of the daemon's --max-builds slots.
	MaxBuilds int `json:"max_builds,omitempty"`
}

// Bounds of the quota values; a value past one is refused (invalid
// argument naming the bound).
const (
	MaxQuotaSandboxes = 100_000
	MaxQuotaMemoryMiB = 1 << 30 // 1 PiB of guest memory
	MaxQuotaBuilds    = 1000
)

// QuotaDefault is the key of the quota for tenants without their own.
const QuotaDefault = "*"

// IsZero reports whether q sets no bound.
func (q Quota) IsZero() bool { return q == (Quota{}) }

// checkQuota validates the quota of tenant (a tenant name or QuotaDefault).
func checkQuota(tenant string, q Quota) error {
	if tenant != QuotaDefault {
		if err := ValidateTenant(tenant); err != nil {
			return err
		}
	}
	if q.MaxSandboxes < 0 || q.MaxSandboxes > MaxQuotaSandboxes {
		return fmt.Errorf("quota max_sandboxes %d out of range: 0 (no limit) to %d: %w", q.MaxSandboxes, MaxQuotaSandboxes, errdefs.ErrInvalidArgument)
	}
	if q.MaxMemoryMiB < 0 || q.MaxMemoryMiB > MaxQuotaMemoryMiB {
		return fmt.Errorf("quota max_memory_mib %d out of range: 0 (no limit) to %d: %w", q.MaxMemoryMiB, int64(MaxQuotaMemoryMiB), errdefs.ErrInvalidArgument)
	}
	if q.MaxBuilds < 0 || q.MaxBuilds > MaxQuotaBuilds {
		return fmt.Errorf("quota max_builds %d out of range: 0 (no limit of its own) to %d: %w", q.MaxBuilds, MaxQuotaBuilds, errdefs.ErrInvalidArgument)
	}
	return nil
}

// SetQuota stores tenant's quota (QuotaDefault: the default for tenants
// without one); a zero Quota removes it. Out-of-range values are invalid
// arguments that name the bound.
func (t *Tokens) SetQuota(tenant string, q Quota) error {
	if err := checkQuota(tenant, q); err != nil {
		return err
	}
	return t.mutate(func(sf *storeFile) error {
		if q.IsZero() {
			delete(sf.Quotas, tenant)
		} else {
			sf.Quotas[tenant] = q
		}
		return nil
	})
}

// QuotaOf returns the quota that applies to tenant: its own, else the
// default (QuotaDefault), else none. own reports whether it is its own.
func (t *Tokens) QuotaOf(tenant string) (q Quota, own bool) {
	t.refresh()
	t.mu.RLock()
	defer t.mu.RUnlock()
	if q, ok := t.quotas[tenant]; ok {
		return q, true
	}
	return t.quotas[QuotaDefault], false
}

// Tenants lists the tenants the store knows, sorted: those of its tokens
// and those with a quota of their own (QuotaDefault is not a tenant).
func (t *Tokens) Tenants() []string {
	t.refresh()
	t.mu.RLock()
	defer t.mu.RUnlock()
	seen := map[string]bool{}
	for _, e := range t.entries {
		seen[e.Tenant] = true
	}
	for k := range t.quotas {
		if k != QuotaDefault {
			seen[k] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
