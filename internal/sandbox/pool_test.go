package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// A fork of n children grows its snapshot's pool to n (at most PoolMax),
// so the next fan-out of that size is served from the pool; forks within
// the base size change nothing; without a fan-out for poolShrinkAfter the
// pool goes back to its base size and the VMMs beyond it are stopped.
func TestFanOutGrowsPool(t *testing.T) {
	ctx := context.Background()
	m := metrics.New("test")
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 1, func(c *Config) { c.PoolMax = 4; c.Metrics = m })
	e.Warm("base")
	snap := e.mustSnap(t, "base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })

	if _, err := e.Fork(ctx, "base", 1); err != nil {
		t.Fatal(err)
	}
	if got := e.PoolTarget(snap.ID); got != 1 {
		t.Fatalf("a fork of 1 set the pool's target to %d, want its base size 1", got)
	}
	if _, err := e.Fork(ctx, "base", 3); err != nil {
		t.Fatal(err)
	}
	if got := e.PoolTarget(snap.ID); got != 3 {
		t.Fatalf("after a fork of 3 the pool's target is %d, want 3", got)
	}
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 3 })
	sbs, err := e.Fork(ctx, "base", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		if !s.Pooled {
			t.Errorf("sandbox %s of the second fan-out of 3 was not pooled", s.ID)
		}
	}
	if _, err := e.Fork(ctx, "base", 6); err != nil {
		t.Fatal(err)
	}
	if got := e.PoolTarget(snap.ID); got != 4 {
		t.Fatalf("after a fork of 6 the pool's target is %d, want PoolMax 4", got)
	}
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 4 })
	p := e.poolFor(snap)
	p.mu.Lock()
	extra := p.items[1:]
	p.mu.Unlock()

	e.shrinkPools(time.Now()) // a fan-out just came
	if e.PoolSize(snap.ID) != 4 {
		t.Fatal("a pool grown moments ago was shrunk")
	}
	e.shrinkPools(time.Now().Add(poolShrinkAfter + time.Minute))
	if got, target := e.PoolSize(snap.ID), e.PoolTarget(snap.ID); got != 1 || target != 1 {
		t.Fatalf("after poolShrinkAfter without a fan-out: %d pooled, target %d; want 1 and 1", got, target)
	}
	for _, pv := range extra {
		waitFor(t, func() bool { return isClosed(pv.machine.Done()) }) // stopped, not leaked
	}
	if body := scrapeText(t, m); !strings.Contains(body, "\n"+`forkd_pool_vmms_stopped_total{reason="shrunk"} 3`+"\n") {
		t.Errorf("the 3 VMMs stopped by the shrink were not counted:\n%s", body)
	}
}

// PoolMax at or below the base size keeps pools at their base size.
func TestPoolMaxOffKeepsBaseSize(t *testing.T) {
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 2, func(c *Config) { c.PoolMax = 0 })
	if _, err := e.Fork(context.Background(), "base", 5); err != nil {
		t.Fatal(err)
	}
	if got := e.PoolTarget(e.mustSnap(t, "base").ID); got != 2 {
		t.Fatalf("pool target %d after a fan-out with PoolMax 0, want 2", got)
	}
}

// Pooled VMMs are a cache: a fork refused only because other snapshots'
// pools hold the guest memory evicts their waiting VMMs and goes on; a
// fork that would not fit even then is refused and evicts nothing.
func TestPoolsYieldToForks(t *testing.T) {
	ctx := context.Background()
	m := metrics.New("test")
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 2, func(c *Config) { c.MaxGuestMemoryMiB = 3 * 64; c.Metrics = m })
	addFakeSnapshot(t, e, "other")
	e.Warm("base")
	base := e.mustSnap(t, "base").ID
	waitFor(t, func() bool { return e.PoolSize(base) == 2 })
	p := e.poolFor(e.mustSnap(t, "base"))
	p.mu.Lock()
	newest := p.items[1]
	p.mu.Unlock()

	// 128 MiB pooled for base + 4 x 64 for other: refused, base's pool kept.
	if _, err := e.Fork(ctx, "other", 4); err == nil {
		t.Fatal("a fork past the limit even without pools was admitted")
	}
	if got := e.PoolSize(base); got != 2 {
		t.Fatalf("a refused fork evicted pooled VMMs: %d left of 2", got)
	}
	// The refused fork's refill of other's pool fits one VMM (64 MiB)
	// under the limit; once it is done, what the next fork needs is known.
	waitFor(t, func() bool { return e.poolIdle(e.mustSnap(t, "other").ID) })
	// 128 MiB pooled + 2 x 64 for other > 192: one pooled VMM of base goes.
	sbs, err := e.Fork(ctx, "other", 2)
	if err != nil {
		t.Fatalf("a fork that fits once base's pool yields: %v", err)
	}
	if len(sbs) != 2 {
		t.Fatalf("%d children", len(sbs))
	}
	waitFor(t, func() bool { return isClosed(newest.machine.Done()) }) // the newest was evicted and stopped
	if got := e.PoolSize(base); got > 1 {
		t.Fatalf("%d VMMs still pooled for base, want at most 1", got)
	}
	if body := scrapeText(t, m); !strings.Contains(body, "\n"+`forkd_pool_vmms_stopped_total{reason="evicted"} 1`+"\n") {
		t.Errorf("the evicted VMM was not counted:\n%s", body)
	}
}

// A driver whose agent channel exists only once the guest runs
// (vmm.Features.AgentAfterRestore, Firecracker's vsock) gets its agent
// dialled after the restore: forks from the pool (restored ahead) and
// started on their path both answer.
func TestAgentDialledAfterRestore(t *testing.T) {
	ctx := context.Background()
	d := &fakeDriver{agentAfterRestore: true}
	e, _ := newFakeEngine(t, d, 1)
	e.Warm("base")
	snap := e.mustSnap(t, "base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
	sbs, err := e.Fork(ctx, "base", 3)
	if err != nil {
		t.Fatal(err)
	}
	pooled := 0
	for _, s := range sbs {
		if s.Pooled {
			pooled++
		}
		a, err := e.Agent(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := a.Info(ctx); err != nil || got.SandboxID != s.ID {
			t.Fatalf("agent of %s says %+v, %v", s.ID, got, err)
		}
	}
	if pooled != 1 {
		t.Errorf("%d of 3 children came from the pool, want 1", pooled)
	}
}

// A fan-out refused at admission does not grow its snapshot's pool: the
// VMMs would wait for forks that cannot come.
func TestRefusedForkDoesNotGrowPool(t *testing.T) {
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 1, func(c *Config) { c.PoolMax = 8; c.MaxSandboxes = 2 })
	if _, err := e.Fork(context.Background(), "base", 5); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a fork of 5 under --max-sandboxes 2: %v", err)
	}
	if got := e.PoolTarget(e.mustSnap(t, "base").ID); got != 1 {
		t.Fatalf("a refused fork of 5 set the pool's target to %d, want its base size 1", got)
	}
}

// VMMs evicted for a fork that is refused anyway go back to their pool,
// ready; a pool closed meanwhile stops them instead.
func TestEvictedVMMsPutBack(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 2)
	e.Warm("base")
	snap := e.mustSnap(t, "base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 2 })
	p := e.poolFor(snap)
	taken := p.evict(1)
	if len(taken) != 1 || e.PoolSize(snap.ID) != 1 {
		t.Fatalf("evict(1) took %d, left %d", len(taken), e.PoolSize(snap.ID))
	}
	p.putBack(taken)
	if e.PoolSize(snap.ID) != 2 || isClosed(taken[0].machine.Done()) {
		t.Fatal("a VMM put back is not waiting, ready, in its pool")
	}
	taken = p.evict(1)
	p.close(context.Background())
	p.putBack(taken)
	waitFor(t, func() bool { return isClosed(taken[0].machine.Done()) })
}

// Close waits for the VMMs being stopped off their caller's goroutine
// (shrink, eviction, a dead one taken from a pool), until its deadline.
func TestCloseWaitsForDiscards(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	e.discards.add() // a discard in flight
	closed := make(chan struct{})
	go func() { e.Close(context.Background()); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a discard was in flight")
	case <-time.After(200 * time.Millisecond):
	}
	e.discards.add() // added while Close waits: waited for too
	e.discards.done()
	select {
	case <-closed:
		t.Fatal("Close returned while a discard added during its wait was in flight")
	case <-time.After(200 * time.Millisecond):
	}
	e.discards.done()
	<-closed

	e2, _ := newFakeEngine(t, &fakeDriver{}, 0)
	e2.discards.add() // stuck: Close gives up at its deadline
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	e2.Close(ctx)
	if e2.discards.pending() != 1 {
		t.Fatal("the stuck discard was not left pending")
	}
}
