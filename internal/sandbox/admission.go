package sandbox

import (
	"fmt"
	"sync"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// Admission: a fork is refused at once (ResourceExhausted, a 429) when
// its children would pass --max-sandboxes, or when the guest memory they
// commit would pass MaxGuestMemoryMiB. Committed memory is each guest's
// full size, whatever it has touched yet: a clone maps its parent's
// memory copy-on-write and can come to write all of it. It counts the
// sandboxes running, the forks in flight, and the VMMs pooled or being
// pooled (a pool does not refill past the limit, and a fork that would
// pass it only because of other snapshots' waiting VMMs evicts them).

// reserveSlots takes the slots and guest memory of n children forked
// through pool p, or refuses the fork. Running sandboxes hold what they
// use (dead and stopped ones hold nothing); forks in flight hold what
// they reserved until they answer, so two concurrent forks can never pass
// a limit together. The pooled VMMs a fork takes count as the fork's
// (until it takes them, as the pool's too). release gives the reservation
// back; by then the fork's children, if it succeeded, count as running
// (a moment of double counting errs on the safe side).
func (e *Engine) reserveSlots(n int, p *pool) (release func(), err error) {
	maxN, maxMiB := e.cfg.MaxSandboxes, e.cfg.MaxGuestMemoryMiB
	if maxN <= 0 && maxMiB <= 0 {
		return func() {}, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	running, runningMiB := e.runningLocked()
	if maxN > 0 && running+e.starting+n > maxN {
		return nil, fmt.Errorf("%d running + %d starting, limit %d: %d more would pass it (forkd serve --max-sandboxes); kill sandboxes you no longer need (`forkd kill`), or retry once forks in flight have answered: %w",
			running, e.starting, maxN, n, errdefs.ErrResourceExhausted)
	}
	needMiB := int64(n) * int64(p.snap.MemoryMiB)
	if maxMiB > 0 {
		pooledMiB := e.pooledMiBLocked()
		// The pooled VMMs this fork will take are counted once: as
		// its own, not as the pool's.
		waiting, _ := p.counts()
		pooledMiB -= int64(min(n, waiting)) * int64(p.snap.MemoryMiB)
		total := runningMiB + e.startingMiB + pooledMiB + needMiB
		if total > maxMiB {
			freed, evicted := e.evictPooledLocked(p, total-maxMiB)
			if total-freed > maxMiB {
				// Not enough after all (a fork took from a pool
				// meanwhile): the VMMs go back, ready, and the fork
				// is refused below.
				for _, ev := range evicted {
					ev.from.putBack(ev.vmms)
				}
			} else {
				n := 0
				for _, ev := range evicted {
					for _, pv := range ev.vmms {
						e.discardLater(pv)
					}
					n += len(ev.vmms)
				}
				if n > 0 {
					e.log.Info("pooled VMMs evicted for a fork under the guest memory limit", "vmms", n, "freed_mib", freed)
					e.cfg.Metrics.ObservePoolStopped(metrics.PoolStopEvicted, n)
				}
				pooledMiB -= freed
				total -= freed
			}
		}
		if total > maxMiB {
			return nil, fmt.Errorf("guest memory: %d MiB running + %d MiB starting + %d MiB pooled, limit %d MiB: %d more children of %q (%d MiB each) would pass it (forkd serve --guest-memory-share); kill sandboxes you no longer need (`forkd kill`): %w",
				runningMiB, e.startingMiB, pooledMiB, maxMiB, n, p.snap.Tag, p.snap.MemoryMiB, errdefs.ErrResourceExhausted)
		}
	}
	e.starting += n
	e.startingMiB += needMiB
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			e.starting -= n
			e.startingMiB -= needMiB
			e.mu.Unlock()
		})
	}, nil
}

// eviction is the VMMs taken from one pool for a fork.
type eviction struct {
	from *pool
	vmms []*prepared
}

// evictPooledLocked takes out at least needMiB of guest memory held by
// VMMs waiting in the pools of snapshots other than p's, for a fork that
// would otherwise be refused: pooled VMMs are a cache, never a reason
// for a 429. It takes nothing when even all of them would not be
// enough. It returns the memory taken and the VMMs, which the caller
// discards outside e.mu (or puts back if the fork is refused anyway);
// e.mu is held.
func (e *Engine) evictPooledLocked(p *pool, needMiB int64) (freed int64, evicted []eviction) {
	var avail int64
	for _, o := range e.pools {
		if o != p {
			waiting, _ := o.counts()
			avail += int64(waiting) * int64(o.snap.MemoryMiB)
		}
	}
	if avail < needMiB {
		return 0, nil
	}
	for _, o := range e.pools {
		if o == p || freed >= needMiB || o.snap.MemoryMiB <= 0 {
			continue
		}
		per := int64(o.snap.MemoryMiB)
		taken := o.evict(int((needMiB - freed + per - 1) / per))
		if len(taken) > 0 {
			freed += int64(len(taken)) * per
			evicted = append(evicted, eviction{from: o, vmms: taken})
		}
	}
	return freed, evicted
}

// runningLocked counts the running sandboxes and their guest memory
// (those of a fork still in flight are covered by its reservation);
// e.mu is held.
func (e *Engine) runningLocked() (n int, miB int64) {
	for _, s := range e.sandboxes {
		s.mu.Lock()
		if s.state == apiv1.StateRunning && s.pendingFork == "" {
			n++
			if s.base != nil {
				miB += int64(s.base.MemoryMiB)
			}
		}
		s.mu.Unlock()
	}
	return n, miB
}

// pooledMiBLocked is the guest memory of the VMMs pooled or being
// prepared for a pool; e.mu is held.
func (e *Engine) pooledMiBLocked() int64 {
	var miB int64
	for _, p := range e.pools {
		waiting, filling := p.counts()
		miB += int64(waiting+filling) * int64(p.snap.MemoryMiB)
	}
	return miB
}

// poolRoom reports whether one more VMM of p's snapshot fits under
// MaxGuestMemoryMiB, for a refill about to prepare it.
func (e *Engine) poolRoom(p *pool) bool {
	maxMiB := e.cfg.MaxGuestMemoryMiB
	if maxMiB <= 0 {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, runningMiB := e.runningLocked()
	// The VMM about to be prepared is counted by its pool already.
	return runningMiB+e.startingMiB+e.pooledMiBLocked() <= maxMiB
}

// Load is what an engine holds against its limits (MaxSandboxes,
// MaxGuestMemoryMiB), for a scheduler choosing between hosts.
type Load struct {
	// Running sandboxes and the guest memory they hold; Starting the
	// children of forks in flight and what those reserved (only under a
	// limit).
	Running, Starting       int
	RunningMiB, StartingMiB int64
	// PooledMiB is the guest memory of the pooled VMMs: a fork that
	// needs room evicts them, so it is committed but not taken.
	PooledMiB int64
	// LimitMiB is MaxGuestMemoryMiB (0: none).
	LimitMiB int64
}

// Load reports what the engine holds now.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, miB := e.runningLocked()
	return Load{
		Running: n, Starting: e.starting, RunningMiB: miB, StartingMiB: e.startingMiB,
		PooledMiB: e.pooledMiBLocked(), LimitMiB: e.cfg.MaxGuestMemoryMiB,
	}
}

// GuestMemory reports the guest memory committed (running sandboxes,
// pooled VMMs and the one being prepared, and the forks in flight, which
// reserve theirs only when a limit is set) and the limit forks are
// admitted under (MaxGuestMemoryMiB; 0: none), in MiB.
func (e *Engine) GuestMemory() (committedMiB, limitMiB int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, runningMiB := e.runningLocked()
	return runningMiB + e.startingMiB + e.pooledMiBLocked(), e.cfg.MaxGuestMemoryMiB
}
