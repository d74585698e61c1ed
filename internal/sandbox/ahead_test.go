package sandbox

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/snapshot"
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

// A child restored ahead whose hand-out fails (its session is alive, its
// identity call is not) is discarded: the fork restores another VMM on
// its path, answers with it, and the failure is counted.
func TestPooledHandOutFailureFallsBack(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 1)
	m := metrics.New("test")
	e.cfg.Metrics = m
	e.Warm("base")
	snap := e.mustSnap(t, "base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
	p := e.poolFor(snap)
	p.mu.Lock()
	broken := p.items[0]
	p.mu.Unlock()
	d.failIdentity.Store(true)
	sbs, err := e.Fork(context.Background(), "base", 1)
	if err != nil {
		t.Fatalf("the fork failed with its pooled child: %v", err)
	}
	if s := sbs[0]; s.ID == broken.id || s.Pooled {
		t.Fatalf("the fork answered with the child whose hand-out failed: %+v", s.Info())
	}
	waitFor(t, func() bool { return isClosed(broken.machine.Done()) })
	a, _ := e.Agent(sbs[0].ID)
	if info, err := a.Info(context.Background()); err != nil || info.SandboxID != sbs[0].ID {
		t.Fatalf("agent says %+v, %v", info, err)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if want := `forkd_pool_handout_failures_total{code="internal"} 1`; !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("metrics lack %s", want)
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

// addPythonSnapshot commits a snapshot tagged tag whose children have a
// Python session (so pooled ones are rehearsed).
func addPythonSnapshot(t *testing.T, e *Engine, tag string) *snapshot.Snapshot {
	t.Helper()
	st, err := e.Store().Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{snapshot.StateFile, snapshot.MemoryFile} {
		os.WriteFile(filepath.Join(st.Dir, f), []byte(f), 0o600)
	}
	snap, err := st.Commit(snapshot.Manifest{VMM: snapshot.VMMRef{Kind: "fake"}, MemoryMiB: 64, VCPUs: 1,
		Python: snapshot.Python{Enabled: true, Rehearse: "x = 1"}})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// A pooled child is rehearsed; one whose rehearsal the agent refuses
// (the code raised, an agent too old to rehearse) is handed out all the
// same, restored and not rehearsed.
func TestPooledChildRehearsal(t *testing.T) {
	for _, c := range []struct {
		name      string
		answer    http.HandlerFunc // nil: the agent has no rehearse API
		rehearsed bool
	}{
		{"rehearsed", func(w http.ResponseWriter, r *http.Request) {
			var req agentapi.RehearseRequest
			if json.NewDecoder(r.Body).Decode(&req) != nil || req.Code != "x = 1" {
				http.Error(w, "bad rehearse request", http.StatusBadRequest)
				return
			}
			w.Write([]byte("{}"))
		}, true},
		{"code raised", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"status":400,"code":"invalid_argument","detail":"rehearsal: the rehearsal raised an error"}`))
		}, false},
		{"old agent", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &fakeDriver{rehearse: c.answer}
			e, _ := newFakeEngine(t, d, 1)
			snap := addPythonSnapshot(t, e, "py")
			e.Warm("py")
			waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
			sbs, err := e.Fork(context.Background(), "py", 1)
			if err != nil {
				t.Fatal(err)
			}
			s := sbs[0]
			if !s.Pooled || s.Rehearsed != c.rehearsed || d.restores.Load() != 1 {
				t.Fatalf("pooled %v rehearsed %v after %d restores; want pooled, rehearsed %v, 1 restore", s.Pooled, s.Rehearsed, d.restores.Load(), c.rehearsed)
			}
			if c.answer != nil && d.rehearsals.Load() < 1 {
				t.Fatal("no rehearsal was asked for")
			}
		})
	}
}

// A pooled child whose rehearsal left its session unusable (the agent
// answers 412: the session was killed) is not handed out.
func TestPooledChildWithDeadSessionAfterRehearsal(t *testing.T) {
	d := &fakeDriver{rehearse: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusPreconditionFailed)
		w.Write([]byte(`{"status":412,"code":"failed_precondition","detail":"the Python session was killed"}`))
	}}
	e, _ := newFakeEngine(t, d, 1)
	snap := addPythonSnapshot(t, e, "py")
	e.Warm("py")
	p := e.poolFor(snap)
	waitFor(t, func() bool {
		_, preparing := p.counts()
		return d.rehearsals.Load() >= 1 && preparing == 0
	})
	if n := e.PoolSize(snap.ID); n != 0 {
		t.Fatalf("%d children pooled after a rehearsal that killed the session", n)
	}
	sbs, err := e.Fork(context.Background(), "py", 1)
	if err != nil {
		t.Fatal(err)
	}
	if sbs[0].Pooled {
		t.Fatal("the fork took a pooled child whose session was killed")
	}
}

// Closing a pool does not wait for a rehearsal in flight.
func TestPoolCloseCancelsRestoreAhead(t *testing.T) {
	d := &fakeDriver{rehearse: func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // a rehearsal that never ends on its own
	}}
	e, _ := newFakeEngine(t, d, 1)
	snap := addPythonSnapshot(t, e, "py")
	e.Warm("py")
	waitFor(t, func() bool { return d.rehearsals.Load() >= 1 })
	done := make(chan struct{})
	go func() {
		e.DropPool(context.Background(), snap.ID)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(rehearseTimeout / 2):
		t.Fatal("closing the pool waited for the rehearsal")
	}
}

// A pool no fork has taken from for PoolIdle is drained by the janitor;
// a fork of its snapshot still answers and fills it again, and a pool
// used since is left alone.
func TestIdlePoolIsDrained(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngineWith(t, d, 1, func(c *Config) { c.PoolIdle = time.Minute })
	e.Warm("base")
	snap := e.mustSnap(t, "base")
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 })
	p := e.poolFor(snap)
	p.mu.Lock()
	waiting := p.items[0]
	p.mu.Unlock()

	e.drainIdlePools(time.Now()) // not idle yet
	if e.PoolSize(snap.ID) != 1 {
		t.Fatal("a pool used less than PoolIdle ago was drained")
	}
	e.drainIdlePools(time.Now().Add(2 * time.Minute))
	if n := e.PoolSize(snap.ID); n != 0 {
		t.Fatalf("%d VMMs still pooled after PoolIdle without a fork", n)
	}
	waitFor(t, func() bool { return isClosed(waiting.machine.Done()) }) // the drained VMM is stopped

	sbs, err := e.Fork(context.Background(), "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	if sbs[0].Pooled {
		t.Fatal("a fork after the drain came from the pool")
	}
	waitFor(t, func() bool { return e.PoolSize(snap.ID) == 1 }) // refilled
	e.drainIdlePools(time.Now().Add(30 * time.Second))
	if e.PoolSize(snap.ID) != 1 {
		t.Fatal("a pool forked from within PoolIdle was drained")
	}
}
