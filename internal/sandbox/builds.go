package sandbox

import (
	"fmt"
	"sync"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Build slots: image builds and snapshot creations run at most
// MaxConcurrentBuilds at once (forkd serve --max-builds); one more is
// refused at once (ResourceExhausted, a 429 with Retry-After), not queued.
//
// A tenant's builds are bounded too, so that one tenant cannot take every
// slot and starve the others:
//
//   - with a quota of builds (TenantQuota.MaxBuilds, `forkd tenant quota
//     NAME --max-builds N`), by it;
//   - without one, by the fairness rule: at most all slots but one,
//     and at least one, i.e. max(1, MaxConcurrentBuilds-1). With the
//     default 2 slots a tenant runs one build at a time and the other
//     slot stays free for the other tenants; a daemon of one slot lets
//     any tenant take it (first come). An admin who wants one tenant to
//     use every slot gives it a quota of builds.
//
// The operator (tenant "": an admin, the Unix socket, the engine's own
// callers) is held to MaxConcurrentBuilds only, as admins are to no
// tenant quota; its builds count against no tenant.

// buildLimit is how many build slots a tenant with quota q may hold, and
// whether the bound is its quota's (own) or the fairness rule's.
func (e *Engine) buildLimit(q TenantQuota) (limit int, own bool) {
	if q.MaxBuilds > 0 {
		return q.MaxBuilds, true
	}
	return max(1, cap(e.buildSem)-1), false
}

// acquireBuild takes a build slot for tenant ("": the operator) with its
// quota q, or fails at once: builds take minutes, so a client is better
// told to retry than left waiting in an unbounded queue. The tenant's
// bound is checked first, so a tenant at it hears of its own bound rather
// than of the daemon's. release gives the slot back (once: BuildSlot).
func (e *Engine) acquireBuild(what, tenant string, q TenantQuota) (release func(), err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if tenant != "" {
		n := e.tenantBuilds[tenant]
		// (The fairness rule of a one-slot daemon is its --max-builds.)
		if limit, own := e.buildLimit(q); n >= limit && (own || limit < cap(e.buildSem)) {
			if own {
				return nil, fmt.Errorf("%s: tenant %q quota max_builds=%d: %d image builds or snapshot creations running; wait for them to finish, or ask an admin to raise the quota (`forkd tenant quota %s --max-builds N`): %w",
					what, tenant, q.MaxBuilds, n, tenant, errdefs.ErrResourceExhausted)
			}
			return nil, fmt.Errorf("%s: tenant %q has no max_builds quota, so it may hold %d of the daemon's %d build slots (one is kept for other tenants): %d image builds or snapshot creations running; wait for them to finish, or ask an admin to set a quota (`forkd tenant quota %s --max-builds N`): %w",
				what, tenant, limit, cap(e.buildSem), n, tenant, errdefs.ErrResourceExhausted)
		}
	}
	select {
	case e.buildSem <- struct{}{}:
	default:
		return nil, fmt.Errorf("%s: %d image builds or snapshot creations already running (forkd serve --max-builds); retry shortly: %w",
			what, cap(e.buildSem), errdefs.ErrResourceExhausted)
	}
	if tenant != "" {
		if e.tenantBuilds == nil {
			e.tenantBuilds = map[string]int{}
		}
		e.tenantBuilds[tenant]++
	}
	return func() {
		e.mu.Lock()
		if tenant != "" {
			if e.tenantBuilds[tenant]--; e.tenantBuilds[tenant] <= 0 {
				delete(e.tenantBuilds, tenant)
			}
		}
		<-e.buildSem
		e.mu.Unlock()
	}, nil
}

// BuildSlot is one of the MaxConcurrentBuilds slots, taken before a
// request answers (TryAcquireBuild) and handed to the build it starts,
// which releases it when done.
type BuildSlot struct {
	release func()
	once    sync.Once
}

// Release gives the slot back, and the tenant's count with it; later
// calls, and calls on nil, do nothing.
func (b *BuildSlot) Release() {
	if b != nil {
		b.once.Do(b.release)
	}
}

// TryAcquireBuild takes a build slot for tenant, bound by its quota's
// MaxBuilds (or the fairness rule above), or fails at once with
// ResourceExhausted (429 with Retry-After), so that an API handler can
// refuse a build before it answers 202 or starts a progress stream,
// instead of reporting the refusal later in an operation or a stream.
// what names the build in the error ("create snapshot py"); tenant ""
// is the operator, bound by MaxConcurrentBuilds only.
func (e *Engine) TryAcquireBuild(what, tenant string, q TenantQuota) (*BuildSlot, error) {
	release, err := e.acquireBuild(what, tenant, q)
	if err != nil {
		return nil, err
	}
	return &BuildSlot{release: release}, nil
}
