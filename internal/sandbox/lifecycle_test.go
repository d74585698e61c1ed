package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// TestBusySandboxIsNotIdle: a request in progress keeps the idle timeout
// from ending its sandbox however long it runs, the idle time counts from
// the end of the request, and an expiring sandbox lets no new request in.
// The janitor's step is called with chosen times (the background janitor
// never fires: the timeout is an hour).
func TestBusySandboxIsNotIdle(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1, IdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id := sbs[0].ID
	_, release, err := e.Acquire(id)
	if err != nil {
		t.Fatal(err)
	}
	// Two hours into a long request: busy, not idle.
	e.expireAt(ctx, time.Now().Add(2*time.Hour))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("sandbox ended in the middle of a request: %v", err)
	}
	released := time.Now()
	release()
	release() // a second call does not count
	if got := sbs[0].LastActivity(); got.Before(released) {
		t.Fatalf("activity %v recorded before the request ended at %v", got, released)
	}
	e.expireAt(ctx, released.Add(time.Hour-time.Second))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("sandbox ended before its idle timeout counted from the request's end: %v", err)
	}

	// AgentFor releases when the request's context ends.
	rctx, cancel := context.WithCancel(ctx)
	if _, err := e.AgentFor(rctx, id); err != nil {
		t.Fatal(err)
	}
	e.expireAt(ctx, time.Now().Add(2*time.Hour))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("sandbox ended during an AgentFor request: %v", err)
	}
	cancel()
	waitFor(t, func() bool {
		sbs[0].mu.Lock()
		defer sbs[0].mu.Unlock()
		return sbs[0].inflight == 0
	})

	// Idle: the janitor closes the door first, then kills.
	if why := sbs[0].beginEnding(time.Now().Add(2 * time.Hour)); !strings.Contains(why, "idle timeout") {
		t.Fatalf("beginEnding = %q", why)
	}
	if _, _, err := e.Acquire(id); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "ending") {
		t.Fatalf("request to an expiring sandbox: %v", err)
	}
	e.Kill(ctx, []string{id})
}

// TestMaxSandboxesIsAtomic: concurrent forks never pass --max-sandboxes
// together; the refusal says what holds the slots; a failed fork gives its
// slots back; dead sandboxes hold none.
func TestMaxSandboxesIsAtomic(t *testing.T) {
	d := &fakeDriver{restoreDelay: 20 * time.Millisecond}
	e, _ := newFakeEngineWith(t, d, 0, func(c *Config) { c.MaxSandboxes = 4 })
	ctx := context.Background()
	var (
		mu      sync.Mutex
		ok      []*Sandbox
		refused []error
		wg      sync.WaitGroup
	)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs, err := e.Fork(ctx, "base", 1)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
				return
			}
			ok = append(ok, sbs...)
		}()
	}
	wg.Wait()
	if len(ok) != 4 || len(refused) != 6 {
		t.Fatalf("%d forks succeeded and %d were refused, want 4 and 6", len(ok), len(refused))
	}
	for _, err := range refused {
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "limit 4") || !strings.Contains(err.Error(), "running +") {
			t.Fatalf("refusal: %v", err)
		}
	}
	if _, err := e.Fork(ctx, "base", 1); !strings.Contains(err.Error(), "4 running + 0 starting, limit 4") {
		t.Fatalf("fork at the limit: %v", err)
	}

	// A dead sandbox frees its slot.
	ok[0].machine.(*fakeMachine).exit(errCrash)
	waitFor(t, func() bool { return ok[0].State() == apiv1.StateDead })
	// A failed fork gives back what it reserved.
	d.failRestore = d.restores.Load() + 1
	if _, err := e.Fork(ctx, "base", 1); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("fork meant to fail: %v", err)
	}
	if _, err := e.Fork(ctx, "base", 1); err != nil {
		t.Fatalf("fork into the slot of a dead sandbox: %v", err)
	}
	if _, err := e.Fork(ctx, "base", 1); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("fork past the limit again: %v", err)
	}
}

// newStateStore opens a state file for a test.
func newStateStore(t *testing.T) *state.Store {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func pendingForks(t *testing.T, st *state.Store) map[string]string {
	t.Helper()
	recs, err := st.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range recs {
		out[r.ID] = r.PendingFork
	}
	return out
}

// TestForkChildrenPendingUntilAnswered: each child is recorded as soon as
// it is ready, marked with the fork's request id, and all of them lose the
// mark together when the fork answers.
func TestForkChildrenPendingUntilAnswered(t *testing.T) {
	st := newStateStore(t)
	d := &fakeDriver{holdRestore: 3, holdGate: make(chan struct{})}
	e, _ := newFakeEngineWith(t, d, 0, func(c *Config) { c.State = st; c.SpawnConcurrency = 3 })
	type result struct {
		sbs []*Sandbox
		err error
	}
	done := make(chan result, 1)
	go func() {
		sbs, err := e.ForkWith(context.Background(), ForkOptions{Tag: "base", Count: 3, RequestID: "req-7"})
		done <- result{sbs, err}
	}()
	// Two children are ready; the third is held in its restore.
	waitFor(t, func() bool { return len(pendingForks(t, st)) == 2 })
	for id, fork := range pendingForks(t, st) {
		if fork != "req-7" {
			t.Fatalf("child %s recorded before its fork answered with pending_fork %q", id, fork)
		}
	}
	close(d.holdGate)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	recs := pendingForks(t, st)
	if len(recs) != 3 {
		t.Fatalf("records after the fork: %v", recs)
	}
	for id, fork := range recs {
		if fork != "" {
			t.Fatalf("child %s still pending (%q) after its fork answered", id, fork)
		}
	}
}

// TestRestartDiscardsPendingForkChildren: a daemon that starts with the
// record of a child whose fork never answered forgets it, removes what it
// owned (namespace, run dir; its VMM process is killed the same way) and
// says so in a lifecycle event, while committed sandboxes are kept.
func TestRestartDiscardsPendingForkChildren(t *testing.T) {
	testutil.RequiresRoot(t)
	st := newStateStore(t)
	runDir, err := os.MkdirTemp("/run", "forkd-unit-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(runDir)
	prefix := "fku" + snapshot.NewID()[:4] + "-"
	ctx := context.Background()
	// What a daemon killed mid-fork leaves: a namespace, a run dir and a
	// pending record for a ready child; a committed record of an earlier
	// fork.
	pendingID, keptID := newSandboxID(), newSandboxID()
	ns, err := netns.Create(ctx, prefix+pendingID, netns.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Remove()
	vmDir := filepath.Join(runDir, "vms", pendingID)
	os.MkdirAll(vmDir, 0o700)
	for _, rec := range []state.SandboxRecord{
		{ID: pendingID, Tag: "base", State: apiv1.StateRunning, VMM: "fake", NetNS: prefix + pendingID, PendingFork: "req-9"},
		{ID: keptID, Tag: "base", State: apiv1.StateRunning, VMM: "fake"},
	} {
		rec.Machine.RunDir = filepath.Join(runDir, "vms", rec.ID)
		if err := st.PutSandbox(rec); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu     sync.Mutex
		events []Event
	)
	e, err := New(Config{
		DataDir: t.TempDir(), RunDir: runDir, Driver: &fakeDriver{}, NetNSPrefix: prefix, State: st,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnEvent: func(ev Event) { mu.Lock(); events = append(events, ev); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	if _, err := e.Get(pendingID); !errdefs.IsNotFound(err) {
		t.Fatalf("child of an unfinished fork listed after restart: %v", err)
	}
	// The fake driver cannot adopt, so the committed one is kept as dead.
	if s, err := e.Get(keptID); err != nil || s.State() != apiv1.StateDead {
		t.Fatalf("committed sandbox after restart: %v", err)
	}
	recs := pendingForks(t, st)
	if _, ok := recs[pendingID]; ok || len(recs) != 1 {
		t.Fatalf("records after restart: %v", recs)
	}
	if left, _ := netns.List(prefix); len(left) != 0 {
		t.Fatalf("namespaces of the discarded child left: %v", left)
	}
	if _, err := os.Stat(vmDir); !os.IsNotExist(err) {
		t.Fatalf("run dir of the discarded child left: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var discarded *Event
	for i := range events {
		if events[i].Kind == EventDiscarded {
			discarded = &events[i]
		}
	}
	if discarded == nil || discarded.SandboxID != pendingID || !strings.Contains(discarded.Reason, "req-9") {
		t.Fatalf("events: %+v", events)
	}
}

// TestKillDuringForkCommitStaysKilled: a child killed (its id is listed)
// while its fork commits is not brought back by the commit: its record
// is gone once both are done. Before, a kill that finished between the
// commit's look at the child and its write left a "running" record of a
// killed sandbox, reported dead ("VMM lost") at the next start.
func TestKillDuringForkCommitStaysKilled(t *testing.T) {
	st := newStateStore(t)
	e, _ := newFakeEngineWith(t, &fakeDriver{}, 0, func(c *Config) { c.State = st })
	ctx := context.Background()
	killed := make(chan string, 1)
	killDone := make(chan struct{})
	testHookCommitFork = func(sbs []*Sandbox) {
		testHookCommitFork = nil
		id := sbs[0].ID
		killed <- id
		go func() {
			defer close(killDone)
			e.Kill(ctx, []string{id})
		}()
		// Let the kill run as far as it can before the write.
		select {
		case <-killDone:
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Cleanup(func() { testHookCommitFork = nil })
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	<-killDone
	id := <-killed
	recs := pendingForks(t, st)
	if _, ok := recs[id]; ok {
		t.Fatalf("record of %s, killed during its fork's commit, is back: %v", id, recs)
	}
	other := sbs[0].ID
	if other == id {
		other = sbs[1].ID
	}
	if fork, ok := recs[other]; !ok || fork != "" || len(recs) != 1 {
		t.Fatalf("records after the fork: %v", recs)
	}
}

// TestBranchKeepsSourceBusy: the idle timeout does not end a sandbox in
// the middle of a branch of it (a live or background one takes minutes).
func TestBranchKeepsSourceBusy(t *testing.T) {
	gate := make(chan struct{})
	var open sync.Once
	openGate := func() { open.Do(func() { close(gate) }) }
	e, _ := newFakeEngine(t, &fakeDriver{snapshotGate: gate}, 0)
	t.Cleanup(openGate) // runs before the engine's Close, which waits for the branch
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1, IdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id := sbs[0].ID
	if _, err := e.BranchAsync(context.Background(), id, BranchOptions{Tag: "b1", Mode: BranchFull}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(e.branchSem) == 1 }) // the branch is under way
	e.expireAt(ctx, time.Now().Add(2*time.Hour))
	if _, err := e.Get(id); err != nil {
		t.Fatalf("sandbox ended by its idle timeout in the middle of a branch: %v", err)
	}
	openGate()
	waitFor(t, func() bool { _, pending := e.Pending("b1"); return !pending })
	if _, err := e.Store().Get("b1"); err != nil {
		t.Fatalf("branch: %v", err)
	}
	// Done: idle again, counted from the branch's end.
	e.expireAt(ctx, time.Now().Add(2*time.Hour))
	if _, err := e.Get(id); !errdefs.IsNotFound(err) {
		t.Fatalf("idle sandbox after the branch: %v", err)
	}
}

// TestForkChildrenStartingUntilTheForkAnswers: a child whose fork has not
// answered (a sibling is still being restored) is listed as starting, not
// running; every child is running once the fork answered.
func TestForkChildrenStartingUntilTheForkAnswers(t *testing.T) {
	d := &fakeDriver{holdRestore: 2, holdGate: make(chan struct{})}
	e, _ := newFakeEngineWith(t, d, 0, func(c *Config) { c.State = newStateStore(t) })
	var openGate sync.Once
	release := func() { openGate.Do(func() { close(d.holdGate) }) }
	type result struct {
		sbs []*Sandbox
		err error
	}
	done := make(chan result, 1)
	forked := make(chan struct{})
	go func() {
		defer close(forked)
		sbs, err := e.ForkWith(context.Background(), ForkOptions{Tag: "base", Count: 2})
		done <- result{sbs, err}
	}()
	// Before the engine closes, also when the test fails early: the fork
	// must end, or its children outlive the engine.
	t.Cleanup(func() { release(); <-forked })
	var states []string
	waitFor(t, func() bool {
		states = states[:0]
		for _, s := range e.List() {
			states = append(states, s.Info().State)
		}
		return len(states) == 1
	})
	if states[0] != apiv1.StateStarting {
		t.Fatalf("a child of a fork in flight is %s, want starting", states[0])
	}
	release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, s := range r.sbs {
		if st := s.Info().State; st != apiv1.StateRunning {
			t.Fatalf("%s after the fork answered: %s", s.ID, st)
		}
	}
}

// TestGoneReason: what a call that lost its agent connection is told.
func TestGoneReason(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	killed, died := sbs[0], sbs[1]
	if err := killed.goneReason(); err != nil {
		t.Fatalf("running sandbox: %v", err)
	}
	if _, err := e.Kill(ctx, []string{killed.ID}); err != nil {
		t.Fatal(err)
	}
	if err := killed.goneReason(); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "was killed") {
		t.Errorf("killed sandbox: %v", err)
	}
	died.machine.(*fakeMachine).exit(errors.New("qemu: boom"))
	if err := died.goneReason(); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "died while the call ran (its VMM process exited: qemu: boom;") {
		t.Errorf("dead sandbox: %v", err)
	}
}
