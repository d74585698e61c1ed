package sandbox

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/state"
)

func dur(d time.Duration) *time.Duration { return &d }

// recordOf is the sandbox's record in the state store.
func recordOf(t *testing.T, st *state.Store, id string) (state.SandboxRecord, bool) {
	t.Helper()
	recs, err := st.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == id {
			return r, true
		}
	}
	return state.SandboxRecord{}, false
}

// TestSetLifetime: a new timeout counts from the call, longer or shorter
// than the old one, 0 lifts it; the idle timeout is replaced alone; each
// change is durable; bad values, unknown ids and dead sandboxes are
// refused with their class. The janitor's step runs at chosen times.
func TestSetLifetime(t *testing.T) {
	st := newStateStore(t)
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.State = st })
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 2, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id := sbs[0].ID

	// Extend: two hours from now, whatever the hour asked at fork.
	before := time.Now()
	s, err := e.SetLifetime(id, Lifetime{Timeout: dur(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	exp := s.Info().ExpiresAt
	if exp == nil || exp.Before(before.Add(2*time.Hour)) || exp.After(time.Now().Add(2*time.Hour)) {
		t.Fatalf("expires_at %v after extending by 2h at %v", exp, before)
	}
	if rec, ok := recordOf(t, st, id); !ok || !rec.ExpiresAt.Equal(*exp) {
		t.Fatalf("record after extending: %+v (want expires_at %v)", rec, exp)
	}
	e.expireAt(ctx, before.Add(90*time.Minute))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("extended sandbox ended at its old timeout: %v", err)
	}

	// The idle timeout alone: the absolute one stays.
	if _, err := e.SetLifetime(id, Lifetime{IdleTimeout: dur(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if info := s.Info(); info.IdleTimeoutSeconds != 600 || info.ExpiresAt == nil || !info.ExpiresAt.Equal(*exp) {
		t.Fatalf("after setting the idle timeout: idle %d s, expires %v", info.IdleTimeoutSeconds, info.ExpiresAt)
	}
	if rec, _ := recordOf(t, st, id); rec.IdleTimeoutSeconds != 600 {
		t.Fatalf("recorded idle timeout %d s, want 600", rec.IdleTimeoutSeconds)
	}
	if _, err := e.SetLifetime(id, Lifetime{IdleTimeout: dur(0)}); err != nil {
		t.Fatal(err)
	}

	// Lift it: no limit, however late.
	if _, err := e.SetLifetime(id, Lifetime{Timeout: dur(0)}); err != nil {
		t.Fatal(err)
	}
	if got := s.Info().ExpiresAt; got != nil {
		t.Fatalf("expires_at %v after timeout 0", got)
	}
	e.expireAt(ctx, time.Now().Add(100*24*time.Hour))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("sandbox without a timeout ended: %v", err)
	}
	// The sibling kept its hour and ended with it.
	if _, err := e.Get(sbs[1].ID); !errdefs.IsNotFound(err) {
		t.Fatalf("sibling past its own timeout: %v", err)
	}

	// Shorten: it ends at the new time, not before.
	before = time.Now()
	if _, err := e.SetLifetime(id, Lifetime{Timeout: dur(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	e.expireAt(ctx, before.Add(59*time.Second))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("sandbox ended before its shortened timeout: %v", err)
	}

	for _, c := range []struct {
		l    Lifetime
		want string
	}{
		{Lifetime{Timeout: dur(-time.Second)}, "timeout -1s"},
		{Lifetime{Timeout: dur(MaxTimeout + time.Second)}, "between 0 (none) and 168h"},
		{Lifetime{IdleTimeout: dur(-time.Second)}, "idle timeout -1s"},
	} {
		if _, err := e.SetLifetime(id, c.l); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetLifetime(%+v) = %v, want InvalidArgument naming %q", c.l, err, c.want)
		}
	}
	if _, err := e.SetLifetime("sb-nosuchthing", Lifetime{Timeout: dur(time.Minute)}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown sandbox: %v", err)
	}

	// Ending: the janitor closed the door; no more life.
	if why := s.beginEnding(time.Now().Add(2 * time.Minute)); why == "" {
		t.Fatal("sandbox past its shortened timeout is not ending")
	}
	if _, err := e.SetLifetime(id, Lifetime{Timeout: dur(time.Hour)}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "ending") {
		t.Fatalf("extending an ending sandbox: %v", err)
	}
	e.Kill(ctx, []string{id})
}

// TestDeadSandboxRetention: a dead sandbox stays listed, with when and
// why it died, for the retention period; after it, the janitor's step
// forgets it and its record. A dead sandbox's life cannot be extended.
func TestDeadSandboxRetention(t *testing.T) {
	st := newStateStore(t)
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.State = st; c.DeadRetention = time.Hour })
	sbs, err := e.Fork(context.Background(), "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	s := sbs[0]
	s.machine.(*fakeMachine).exit(errCrash)
	waitFor(t, func() bool { return s.State() == apiv1.StateDead })
	<-s.exited
	ended := s.Info().EndedAt
	if ended == nil {
		t.Fatal("dead sandbox has no ended_at")
	}
	if rec, ok := recordOf(t, st, s.ID); !ok || !rec.EndedAt.Equal(*ended) {
		t.Fatalf("dead sandbox's record %+v, want ended_at %v", rec, ended)
	}
	if _, err := e.SetLifetime(s.ID, Lifetime{Timeout: dur(time.Hour)}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "dead") {
		t.Fatalf("extending a dead sandbox: %v", err)
	}
	e.forgetDeadAt(ended.Add(59 * time.Minute))
	if _, err := e.Get(s.ID); err != nil {
		t.Fatalf("dead sandbox forgotten within its retention: %v", err)
	}
	e.forgetDeadAt(ended.Add(61 * time.Minute))
	if _, err := e.Get(s.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("dead sandbox still listed after its retention: %v", err)
	}
	if rec, ok := recordOf(t, st, s.ID); ok {
		t.Fatalf("dead sandbox's record kept after its retention: %+v", rec)
	}
}

// TestSandboxEventMetrics: each way a sandbox begins or ends is counted
// once, under its own event: created, failed, expired, died, killed.
func TestSandboxEventMetrics(t *testing.T) {
	// No pool: the 4 children restore on the fork's path, then the second
	// fork's second restore fails.
	d := &fakeDriver{failRestore: 6}
	e, _ := newFakeEngine(t, d, 0)
	m := metrics.New("test")
	e.cfg.Metrics = m
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 4, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e.Kill(ctx, []string{sbs[0].ID})
	sbs[1].machine.(*fakeMachine).exit(errCrash)
	waitFor(t, func() bool { return sbs[1].State() == apiv1.StateDead })
	e.Kill(ctx, []string{sbs[1].ID}) // removing the dead is not a kill
	e.SetLifetime(sbs[2].ID, Lifetime{Timeout: dur(time.Minute)})
	e.SetLifetime(sbs[3].ID, Lifetime{Timeout: dur(0)})
	e.expireAt(ctx, time.Now().Add(2*time.Hour))
	if _, err := e.Fork(ctx, "base", 2); err == nil {
		t.Fatal("fork with failing restores succeeded")
	}

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, l := range []string{
		`forkd_sandbox_events_total{event="created"} 4`,
		`forkd_sandbox_events_total{event="killed"} 1`,
		`forkd_sandbox_events_total{event="died"} 1`,
		`forkd_sandbox_events_total{event="expired"} 1`,
		`forkd_sandbox_events_total{event="failed"} 2`,
	} {
		if !strings.Contains(body, l+"\n") {
			t.Errorf("metrics lack %s", l)
		}
	}
	e.Kill(ctx, []string{sbs[3].ID})
}

// TestLifecycleEvents: the engine reports each sandbox created (when its
// fork answers) and killed, with its tenant; a branch's snapshot as its
// source sandbox's tenant's (or the one the branch names); each snapshot
// removed; a failed fork reports no sandbox created.
func TestLifecycleEvents(t *testing.T) {
	e, _ := newFakeEngineWith(t, &fakeDriver{failRestore: 3}, 0, nil)
	var (
		mu  sync.Mutex
		got []string
	)
	e.cfg.OnEvent = func(ev Event) {
		mu.Lock()
		got = append(got, ev.Kind+" "+ev.SandboxID+" "+ev.Tag+" "+ev.Tenant)
		mu.Unlock()
	}
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 2, Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Fork(ctx, "base", 1); err == nil {
		t.Fatal("fork with a failing restore succeeded")
	}
	if _, err := e.Branch(ctx, sbs[1].ID, BranchOptions{Tag: "b1", Mode: BranchFull}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Branch(ctx, sbs[1].ID, BranchOptions{Tag: "b2", Mode: BranchFull, Tenant: "beta"}); err != nil {
		t.Fatal(err)
	}
	e.Kill(ctx, []string{sbs[1].ID})
	if _, err := e.RemoveSnapshotWith(ctx, "base", RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	defer e.Kill(ctx, []string{sbs[0].ID})
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"sandbox.created " + sbs[0].ID + " base acme", "sandbox.created " + sbs[1].ID + " base acme",
		"snapshot.created " + sbs[1].ID + " b1 acme", "snapshot.created " + sbs[1].ID + " b2 beta",
		"sandbox.killed " + sbs[1].ID + " base acme", "snapshot.deleted  base ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
