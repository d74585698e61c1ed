package sandbox

import (
	"context"
	"testing"
)

// A pooled VMM is restored ahead: the fork that takes it restores
// nothing and only gives the child its identity.
func TestPoolRestoresAhead(t *testing.T) {
	for _, startOnly := range []bool{false, true} {
		d := &fakeDriver{}
		e, _ := newFakeEngineWith(t, d, 1, func(c *Config) { c.PoolStartOnly = startOnly })
		e.Warm("base")
		id := e.mustSnap(t, "base").ID
		waitFor(t, func() bool { return e.PoolSize(id) == 1 })
		wantAhead := int64(1)
		if startOnly {
			wantAhead = 0
		}
		if got := d.restores.Load(); got != wantAhead {
			t.Fatalf("start only %v: %d restores with the pool full, want %d", startOnly, got, wantAhead)
		}
		sbs, err := e.Fork(context.Background(), "base", 1)
		if err != nil {
			t.Fatal(err)
		}
		s := sbs[0]
		if !s.Pooled {
			t.Fatalf("start only %v: the child did not come from the pool", startOnly)
		}
		if got := d.restores.Load(); got != 1 {
			t.Fatalf("start only %v: %d restores after the fork, want 1", startOnly, got)
		}
		if got, want := d.identities.Load(), wantAhead; got != want {
			t.Fatalf("start only %v: %d identities given after the hello, want %d", startOnly, got, want)
		}
		a, err := e.Agent(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := a.Info(context.Background()); err != nil || info.SandboxID != s.ID {
			t.Fatalf("start only %v: agent says %+v, %v", startOnly, info, err)
		}
		e.Kill(context.Background(), []string{s.ID})
	}
}

// A child restored ahead whose agent session ended while it waited is
// discarded; the fork restores another VMM on its path.
func TestPooledChildWithDeadSessionIsDiscarded(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 1)
	e.Warm("base")
	snap := e.mustSnap(t, "base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
	p := e.poolFor(snap)
	p.mu.Lock()
	dead := p.items[0]
	p.mu.Unlock()
	dead.session.Close()
	sbs, err := e.Fork(context.Background(), "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	if sbs[0].ID == dead.id || sbs[0].Pooled {
		t.Fatalf("the fork used the pooled child whose session ended: %+v", sbs[0].Info())
	}
	a, _ := e.Agent(sbs[0].ID)
	if info, err := a.Info(context.Background()); err != nil || info.SandboxID != sbs[0].ID {
		t.Fatalf("agent says %+v, %v", info, err)
	}
}
