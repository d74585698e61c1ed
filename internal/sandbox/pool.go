package sandbox

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// pool keeps pre-started VMM processes for one snapshot, so a fork pays only
// for the restore: QEMU's own start-up (~150 ms here) and the network
// namespace happen ahead of time. Refills run one at a time in the
// background, after a fork returns, so they do not compete with it for CPU.
//
// A pool holds size VMMs (Config.PoolSize), or more while fan-outs come:
// a fork of n children raises its target to n (at most Config.PoolMax),
// so the next fan-out of that size finds them restored ahead; the target
// falls back to size once no fork larger than size has come for
// poolShrinkAfter. Pooled VMMs are a cache: a fork that would pass the
// guest memory limit only because of other snapshots' pools evicts them
// (admission.go).
type pool struct {
	e    *Engine
	snap *snapshot.Snapshot
	size int
	// filler tracks the background refill, so close can wait for a VMM
	// being prepared and discard it instead of leaking it.
	filler sync.WaitGroup
	// ctx ends when the pool is closed: a refill restoring ahead (up to
	// minutes for a rehearsal) gives up instead of holding close up.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the fields below.
	mu      sync.Mutex
	items   []*prepared
	filling bool
	// preparing is set while the refill prepares a VMM: its guest
	// memory counts against MaxGuestMemoryMiB (admission.go).
	preparing bool
	closed    bool
	// lastUse is when the pool was made or a fork last took from it
	// (drainIdle).
	lastUse time.Time
	// target is the number of VMMs the refill keeps: size, or more after
	// a fan-out (grow) until grownAt is poolShrinkAfter old (shrink).
	target  int
	grownAt time.Time
}

// poolShrinkAfter is how long a pool grown by a fan-out keeps its target
// without another fork larger than its base size.
const poolShrinkAfter = 10 * time.Minute

func (e *Engine) poolFor(snap *snapshot.Snapshot) *pool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.pools[snap.ID]
	if p == nil {
		p = &pool{e: e, snap: snap, size: e.cfg.PoolSize, target: e.cfg.PoolSize, lastUse: time.Now()}
		p.ctx, p.cancel = context.WithCancel(e.life)
		e.pools[snap.ID] = p
	}
	return p
}

// Warm starts filling the pool of a snapshot (after creation, at start-up).
func (e *Engine) Warm(tag string) error {
	snap, err := e.store.Get(tag)
	if err != nil {
		return err
	}
	if err := e.canRestore(snap); err != nil {
		return err // its VMMs would wait for a restore that fails
	}
	e.poolFor(snap).refill()
	return nil
}

// take returns a ready VMM, or nil when the pool is empty. VMMs that died
// while waiting are discarded.
func (p *pool) take() (*prepared, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastUse = time.Now()
	for len(p.items) > 0 {
		pv := p.items[0]
		p.items = p.items[1:]
		select {
		case <-pv.machine.Done():
			p.e.log.Warn("pooled VMM died while waiting", "sandbox_id", pv.id, "err", pv.machine.ExitError())
			p.e.discardLater(pv)
			continue
		case <-pv.sessionDone():
			p.e.log.Warn("the agent session of a pooled child ended while waiting", "sandbox_id", pv.id)
			p.e.discardLater(pv)
			continue
		default:
		}
		return pv, true
	}
	return nil, false
}

func (p *pool) ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.items)
}

// counts is the number of VMMs waiting, and being prepared (0 or 1).
func (p *pool) counts() (waiting, preparing int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.preparing {
		preparing = 1
	}
	return len(p.items), preparing
}

// grow raises the pool's target toward a fork of n children, at most
// limit, and keeps a grown target alive: each fork larger than the base
// size restarts its poolShrinkAfter. The refill after the fork fills it.
func (p *pool) grow(n, limit int, now time.Time) {
	if p.size <= 0 || n <= p.size || limit <= p.size {
		return // a pool of 0 is off; forks within the base size change nothing
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = min(max(p.target, n), limit)
	p.grownAt = now
}

// shrink takes a grown target back to the base size once no fork larger
// than it has come for after, stops the VMMs waiting beyond it, and
// reports how many it stopped.
func (p *pool) shrink(now time.Time, after time.Duration) int {
	p.mu.Lock()
	if p.target <= p.size || now.Sub(p.grownAt) < after {
		p.mu.Unlock()
		return 0
	}
	p.target = p.size
	var extra []*prepared
	if len(p.items) > p.size {
		extra = p.items[p.size:]
		p.items = slices.Clone(p.items[:p.size])
	}
	p.mu.Unlock()
	for _, pv := range extra {
		p.e.discardLater(pv)
	}
	return len(extra)
}

// evict takes up to n waiting VMMs out of the pool, newest first, for
// the caller to discard (admission.go: a fork that needs their guest
// memory). It does not lower the target: the next refill tries again,
// within the limit.
func (p *pool) evict(n int) []*prepared {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(n, len(p.items))
	out := slices.Clone(p.items[len(p.items)-n:])
	p.items = p.items[:len(p.items)-n]
	return out
}

// putBack returns VMMs evict took, for a fork refused anyway; a pool
// closed meanwhile discards them.
func (p *pool) putBack(vmms []*prepared) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, pv := range vmms {
			p.e.discardLater(pv)
		}
		return
	}
	p.items = append(p.items, vmms...)
}

// poolOf is the pool of a snapshot id, nil if it has none.
func (e *Engine) poolOf(snapshotID string) *pool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pools[snapshotID]
}

// PoolTarget reports how many VMMs the pool of a snapshot keeps now (its base
// size, or more after a fan-out); 0 when the snapshot has no pool.
func (e *Engine) PoolTarget(snapshotID string) int {
	p := e.poolOf(snapshotID)
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// refill tops the pool up to its target in the background.
func (p *pool) refill() {
	p.mu.Lock()
	if p.filling || p.closed || len(p.items) >= p.target {
		p.mu.Unlock()
		return
	}
	p.filling = true
	p.filler.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.filler.Done()
		for {
			p.mu.Lock()
			if p.closed || len(p.items) >= p.target {
				p.filling = false
				p.mu.Unlock()
				return
			}
			p.preparing = true
			p.mu.Unlock()
			if !p.e.poolRoom(p) {
				// Forks get their VMMs started on their path instead;
				// the next fork's refill tries again.
				p.e.log.Debug("pool not refilled: the guest memory limit is reached", "tag", p.snap.Tag)
				p.e.cfg.Metrics.ObservePoolRefillFailure(errdefs.ErrResourceExhausted)
				p.mu.Lock()
				p.preparing, p.filling = false, false
				p.mu.Unlock()
				return
			}
			pv, err := p.e.prepare(p.ctx, p.snap, poolNice)
			if err == nil && !p.e.cfg.PoolStartOnly {
				if err = p.e.restoreAhead(p.ctx, pv); err != nil {
					pv.discard(context.Background())
				}
			}
			if err != nil {
				p.e.log.Warn("pool refill failed", "tag", p.snap.Tag, "err", err)
				if p.ctx.Err() == nil { // not the pool closing (snapshot removed, daemon stopping)
					p.e.cfg.Metrics.ObservePoolRefillFailure(err)
				}
				p.mu.Lock()
				p.preparing, p.filling = false, false
				p.mu.Unlock()
				return
			}
			p.mu.Lock()
			p.preparing = false
			if p.closed {
				p.mu.Unlock()
				pv.discard(context.Background())
				return
			}
			p.items = append(p.items, pv)
			p.mu.Unlock()
		}
	}()
}

// drainIdle stops the VMMs waiting in a pool no fork has taken from since
// idle before now, and reports how many it stopped. A refill in flight
// is left alone (a fork just asked for it). The pool stays open: the
// next fork refills it.
func (p *pool) drainIdle(now time.Time, idle time.Duration) int {
	p.mu.Lock()
	if p.closed || p.filling || len(p.items) == 0 || now.Sub(p.lastUse) < idle {
		p.mu.Unlock()
		return 0
	}
	items := p.items
	p.items = nil
	p.mu.Unlock()
	for _, pv := range items {
		// Not on the janitor's goroutine: a teardown would hold up the
		// sandboxes' timeouts it also enforces.
		p.e.discardLater(pv)
	}
	return len(items)
}

// poolList is the engine's pools at this moment.
func (e *Engine) poolList() []*pool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Collect(maps.Values(e.pools))
}

// drainIdlePools drains the pools idle for PoolIdle at now (janitor).
func (e *Engine) drainIdlePools(now time.Time) {
	if e.cfg.PoolIdle <= 0 {
		return
	}
	for _, p := range e.poolList() {
		if n := p.drainIdle(now, e.cfg.PoolIdle); n > 0 {
			e.log.Info("pool drained: no fork took from it", "tag", p.snap.Tag, "vmms", n, "idle", e.cfg.PoolIdle)
			e.cfg.Metrics.ObservePoolStopped(metrics.PoolStopIdle, n)
		}
	}
}

// shrinkPools takes the pools grown by fan-outs back to their base size
// once no fan-out has come for poolShrinkAfter (janitor).
func (e *Engine) shrinkPools(now time.Time) {
	for _, p := range e.poolList() {
		if n := p.shrink(now, poolShrinkAfter); n > 0 {
			e.log.Info("pool shrunk to its base size: no fan-out came", "tag", p.snap.Tag, "vmms", n, "size", p.size)
			e.cfg.Metrics.ObservePoolStopped(metrics.PoolStopShrunk, n)
		}
	}
}

// close discards every waiting VMM, waits for a refill in flight (which
// discards what it prepared), and makes later refills do nothing.
func (p *pool) close(ctx context.Context) {
	p.mu.Lock()
	p.closed = true
	items := p.items
	p.items = nil
	p.mu.Unlock()
	p.cancel()
	for _, pv := range items {
		pv.discard(ctx)
	}
	p.filler.Wait()
}

// PoolPIDs returns the VMM processes waiting in a snapshot's pool (for
// benchmarks that measure what a waiting VMM costs).
func (e *Engine) PoolPIDs(snapshotID string) []int {
	p := e.poolOf(snapshotID)
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pids := make([]int, 0, len(p.items))
	for _, pv := range p.items {
		pids = append(pids, pv.machine.PID())
	}
	return pids
}
