package sandbox

import (
	"fmt"
	"sync"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Tenant quotas: a fork for a tenant with a quota (ForkOptions.Quota) is
// refused at once (ResourceExhausted, a 429) when the tenant's sandboxes
// would pass it. Like the daemon-wide limits (admission.go) they count
// running sandboxes and forks in flight, each guest at its full memory
// size; dead and stopped sandboxes hold nothing. Sandboxes recorded before
// tenants existed (no Tenant) count against no quota.

// TenantQuota bounds one tenant's sandboxes and builds; zero fields set
// no bound (MaxBuilds 0: the fairness rule of builds.go).
type TenantQuota struct {
	MaxSandboxes int
	MaxMemoryMiB int64
	MaxBuilds    int
}

// TenantUsage is what one tenant's sandboxes and builds hold.
type TenantUsage struct {
	Sandboxes int
	MemoryMiB int64
	// Builds counts the build slots it holds (builds.go); forks in flight
	// (tenantStarting) reserve none.
	Builds int
}

// TenantUsage returns what tenant's running sandboxes, forks in flight
// and builds hold.
func (e *Engine) TenantUsage(tenant string) TenantUsage {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tenantUsageLocked(tenant)
}

// tenantUsageLocked counts as runningLocked does, for one tenant; e.mu is
// held.
func (e *Engine) tenantUsageLocked(tenant string) TenantUsage {
	u := e.tenantStarting[tenant]
	for _, s := range e.sandboxes {
		if s.Tenant != tenant {
			continue
		}
		s.mu.Lock()
		if s.state == apiv1.StateRunning && s.pendingFork == "" {
			u.Sandboxes++
			if s.base != nil {
				u.MemoryMiB += int64(s.base.MemoryMiB)
			}
		}
		s.mu.Unlock()
	}
	u.Builds = e.tenantBuilds[tenant]
	return u
}

// reserveTenant takes n children of memMiB each from tenant's quota q, or
// refuses the fork naming the quota, its value and the tenant's use.
// release gives the reservation back (see reserveSlots).
func (e *Engine) reserveTenant(tenant string, q TenantQuota, n, memMiB int) (release func(), err error) {
	if q.MaxSandboxes == 0 && q.MaxMemoryMiB == 0 {
		return func() {}, nil
	}
	need := TenantUsage{Sandboxes: n, MemoryMiB: int64(n) * int64(memMiB)}
	e.mu.Lock()
	defer e.mu.Unlock()
	u := e.tenantUsageLocked(tenant)
	if q.MaxSandboxes > 0 && u.Sandboxes+need.Sandboxes > q.MaxSandboxes {
		return nil, fmt.Errorf("tenant %q quota max_sandboxes=%d: %d sandboxes in use (running or starting), %d more would pass it; kill sandboxes you no longer need (`forkd kill`), or ask an admin to raise the quota (`forkd tenant quota %s --max-sandboxes N`): %w",
			tenant, q.MaxSandboxes, u.Sandboxes, need.Sandboxes, tenant, errdefs.ErrResourceExhausted)
	}
	if q.MaxMemoryMiB > 0 && u.MemoryMiB+need.MemoryMiB > q.MaxMemoryMiB {
		return nil, fmt.Errorf("tenant %q quota max_memory_mib=%d: %d MiB of guest memory in use, %d more (%d x %d MiB) would pass it; kill sandboxes you no longer need (`forkd kill`), or ask an admin to raise the quota (`forkd tenant quota %s --max-memory-mib N`): %w",
			tenant, q.MaxMemoryMiB, u.MemoryMiB, need.MemoryMiB, n, memMiB, tenant, errdefs.ErrResourceExhausted)
	}
	if e.tenantStarting == nil {
		e.tenantStarting = map[string]TenantUsage{}
	}
	e.addStartingLocked(tenant, need, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			e.addStartingLocked(tenant, need, -1)
			e.mu.Unlock()
		})
	}, nil
}

// addStartingLocked adds (sign 1) or removes (-1) a reservation; e.mu is
// held.
func (e *Engine) addStartingLocked(tenant string, u TenantUsage, sign int) {
	cur := e.tenantStarting[tenant]
	cur.Sandboxes += sign * u.Sandboxes
	cur.MemoryMiB += int64(sign) * u.MemoryMiB
	if cur == (TenantUsage{}) {
		delete(e.tenantStarting, tenant)
		return
	}
	e.tenantStarting[tenant] = cur
}
