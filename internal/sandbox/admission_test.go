package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestGuestMemoryAdmission: forks past MaxGuestMemoryMiB are refused with
// the numbers; a killed sandbox gives its memory back; pooled VMMs count,
// and a pool does not refill past the limit. The fake snapshot has 64 MiB.
func TestGuestMemoryAdmission(t *testing.T) {
	ctx := context.Background()
	t.Run("running", func(t *testing.T) {
		e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.MaxGuestMemoryMiB = 3 * 64 })
		sbs, err := e.Fork(ctx, "base", 3)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Fork(ctx, "base", 1)
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "192 MiB running + 0 MiB starting + 0 MiB pooled, limit 192 MiB") {
			t.Fatalf("fork past the limit: %v", err)
		}
		if _, err := e.Kill(ctx, []string{sbs[0].ID}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Fork(ctx, "base", 1); err != nil {
			t.Fatalf("fork into a killed sandbox's memory: %v", err)
		}
	})
	t.Run("pooled", func(t *testing.T) {
		e, _ := newFakeEngineWith(t, &fakeDriver{}, 2, func(c *Config) { c.MaxGuestMemoryMiB = 3 * 64 })
		e.Warm("base")
		id := e.mustSnap(t, "base").ID
		waitFor(t, func() bool { return e.PoolSize(id) == 2 })
		// 64 running + 2 x 64 pooled: the pool refills to 2 within 192.
		if _, err := e.Fork(ctx, "base", 1); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return e.PoolSize(id) == 2 })
		// The second takes a pooled VMM; the pool then stays at one.
		if _, err := e.Fork(ctx, "base", 1); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return e.poolIdle(id) })
		if got := e.PoolSize(id); got != 1 {
			t.Fatalf("pool refilled to %d past the limit", got)
		}
		if _, err := e.Fork(ctx, "base", 1); err != nil {
			t.Fatalf("fork taking the last pooled VMM: %v", err)
		}
		if _, err := e.Fork(ctx, "base", 1); !errdefs.IsResourceExhausted(err) {
			t.Fatalf("fork past the limit: %v", err)
		}
	})
}

// poolIdle reports whether the pool of a snapshot has no refill running.
func (e *Engine) poolIdle(snapshotID string) bool {
	e.mu.Lock()
	p := e.pools[snapshotID]
	e.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.filling
}
