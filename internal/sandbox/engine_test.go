package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// newFakeEngine returns an engine over the fake driver with one snapshot
// tagged "base". Namespaces are real (the engine always makes them), so
// this needs root.
func newFakeEngine(t *testing.T, d *fakeDriver, poolSize int) (*Engine, string) {
	t.Helper()
	return newFakeEngineWith(t, d, poolSize, nil)
}

// newFakeEngineWith is newFakeEngine with changes to its Config (nil:
// none) made before the engine starts.
func newFakeEngineWith(t *testing.T, d *fakeDriver, poolSize int, change func(*Config)) (*Engine, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	runDir, err := os.MkdirTemp("/run", "forkd-unit-")
	if err != nil {
		t.Fatal(err)
	}
	prefix := "fku" + snapshot.NewID()[:4] + "-"
	cfg := Config{
		DataDir: t.TempDir(), RunDir: runDir, Driver: d, PoolSize: poolSize,
		MaxForkCount: 10, NetNSPrefix: prefix,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if change != nil {
		change(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A loaded host's slow handshake must not add identity calls the
	// tests count; TestClockSetAfterSlowHandshake sets its own.
	e.clockSlack = time.Hour
	t.Cleanup(func() {
		e.Close(context.Background())
		os.RemoveAll(runDir)
		if left, _ := netns.List(prefix); len(left) > 0 {
			t.Errorf("network namespaces left behind: %v", left)
		}
	})
	addFakeSnapshot(t, e, "base")
	return e, prefix
}

// addFakeSnapshot commits a snapshot of the fake driver (64 MiB, 1 vCPU)
// tagged tag.
func addFakeSnapshot(t *testing.T, e *Engine, tag string) {
	t.Helper()
	st, err := e.Store().Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{snapshot.StateFile, snapshot.MemoryFile} {
		os.WriteFile(filepath.Join(st.Dir, f), []byte(f), 0o600)
	}
	if _, err := st.Commit(snapshot.Manifest{VMM: snapshot.VMMRef{Kind: "fake"}, MemoryMiB: 64, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestForkRegistersAnsweringSandboxes(t *testing.T) {
	d := &fakeDriver{}
	e, prefix := newFakeEngine(t, d, 2)
	e.Warm("base")
	waitFor(t, func() bool { return e.PoolSize(e.mustSnap(t, "base").ID) == 2 })
	sbs, err := e.Fork(context.Background(), "base", 3)
	if err != nil {
		t.Fatal(err)
	}
	pooled := 0
	for _, s := range sbs {
		info := s.Info()
		if info.State != apiv1.StateRunning || !strings.HasPrefix(info.NetNS, prefix) {
			t.Fatalf("sandbox %+v", info)
		}
		if info.Pooled {
			pooled++
		}
		a, err := e.Agent(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.Info(context.Background())
		if err != nil || got.SandboxID != s.ID {
			t.Fatalf("agent of %s says %+v, %v", s.ID, got, err)
		}
	}
	if pooled != 2 {
		t.Errorf("%d sandboxes came from the pool, want 2", pooled)
	}
	if len(e.List()) != 3 {
		t.Fatalf("listed %d", len(e.List()))
	}
}

func TestForkFailureTearsDownWholeRequest(t *testing.T) {
	d := &fakeDriver{failRestore: 2}
	e, prefix := newFakeEngine(t, d, 0)
	_, err := e.Fork(context.Background(), "base", 4)
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Fork = %v, want the injected failure", err)
	}
	if n := len(e.List()); n != 0 {
		t.Fatalf("%d sandboxes registered after a failed fork", n)
	}
	waitFor(t, func() bool { return d.alive() == 0 })
	waitFor(t, func() bool { left, _ := netns.List(prefix); return len(left) == 0 })
}

func TestForkAbandonedByClient(t *testing.T) {
	d := &fakeDriver{restoreDelay: 300 * time.Millisecond}
	e, _ := newFakeEngine(t, d, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := e.Fork(ctx, "base", 3); err == nil {
		t.Fatal("Fork succeeded after its context ended")
	}
	if n := len(e.List()); n != 0 {
		t.Fatalf("%d sandboxes left by an abandoned fork", n)
	}
	waitFor(t, func() bool { return d.alive() == 0 })
}

func TestDeadVMMMarksSandboxDead(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 0)
	sbs, err := e.Fork(context.Background(), "base", 2)
	if err != nil {
		t.Fatal(err)
	}
	sbs[0].machine.(*fakeMachine).exit(errCrash)
	waitFor(t, func() bool { return sbs[0].State() == apiv1.StateDead })
	info := sbs[0].Info()
	if !strings.Contains(info.DeadReason, "crashed") || !strings.Contains(info.ConsoleTail, "panic") {
		t.Fatalf("dead sandbox: %+v", info)
	}
	if _, err := e.Agent(sbs[0].ID); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "crashed") {
		t.Fatalf("agent of a dead sandbox: %v", err)
	}
	if sbs[1].State() != apiv1.StateRunning {
		t.Fatal("sibling affected")
	}
	// kill removes the dead sandbox's record.
	if _, err := e.Kill(context.Background(), []string{sbs[0].ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Get(sbs[0].ID); !errdefs.IsNotFound(err) {
		t.Fatalf("dead sandbox still listed after kill: %v", err)
	}
}

func TestForkArgumentErrors(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	ctx := context.Background()
	for _, c := range []struct {
		tag  string
		n    int
		want func(error) bool
		says string
	}{
		{"base", 0, errdefs.IsInvalidArgument, "at least 1"},
		{"base", 11, errdefs.IsInvalidArgument, "limit of 10"},
		{"missing", 1, errdefs.IsNotFound, "existing tags: base"},
		{"Bad", 1, errdefs.IsInvalidArgument, snapshot.TagRule},
	} {
		_, err := e.Fork(ctx, c.tag, c.n)
		if !c.want(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Fork(%q, %d) = %v, want an error saying %q", c.tag, c.n, err, c.says)
		}
	}
}

func (e *Engine) mustSnap(t *testing.T, tag string) *snapshot.Snapshot {
	t.Helper()
	s, err := e.Store().Get(tag)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTimeoutsEndSandboxes(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 0)
	events := make(chan Event, 4)
	e.cfg.OnEvent = func(ev Event) {
		if ev.Kind == EventExpired {
			events <- ev
		}
	}
	ctx := context.Background()
	abs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1, Timeout: 1500 * time.Millisecond, Labels: map[string]string{"job": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	idle, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1, IdleTimeout: 3 * time.Second, Labels: map[string]string{"job": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	forever, err := e.Fork(ctx, "base", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !abs[0].MatchLabels(map[string]string{"job": "a"}) || abs[0].MatchLabels(map[string]string{"job": "b"}) {
		t.Fatal("label match")
	}
	if info := abs[0].Info(); info.ExpiresAt == nil || info.Metadata["job"] != "a" {
		t.Fatalf("info: %+v", info)
	}
	// Keep the idle one busy (a request every 100 ms, far within its idle
	// timeout) until the absolute one has ended.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := e.Agent(idle[0].ID); err != nil {
			t.Fatalf("busy sandbox ended by its idle timeout: %v", err)
		}
		if _, err := e.Get(abs[0].ID); errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox past its timeout still there")
		}
	}
	waitFor(t, func() bool { _, err := e.Get(idle[0].ID); return errdefs.IsNotFound(err) })
	if _, err := e.Get(forever[0].ID); err != nil {
		t.Fatalf("sandbox without timeouts ended: %v", err)
	}
	got := map[string]string{}
	for len(got) < 2 {
		select {
		case ev := <-events:
			got[ev.SandboxID] = ev.Kind + ": " + ev.Reason
		case <-time.After(time.Minute):
			t.Fatalf("expiry events: %v", got)
		}
	}
	if !strings.Contains(got[abs[0].ID], "expired: timeout") || !strings.Contains(got[idle[0].ID], "idle timeout") {
		t.Fatalf("events: %v", got)
	}
}

func TestForkOptionErrors(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	for _, o := range []ForkOptions{
		{Tag: "base", Count: 1, Timeout: -time.Second},
		{Tag: "base", Count: 1, IdleTimeout: MaxTimeout + time.Second},
		{Tag: "base", Count: 1, Labels: map[string]string{"Bad Key": "x"}},
		{Tag: "base", Count: 1, Labels: map[string]string{"k": strings.Repeat("v", 300)}},
	} {
		if _, err := e.ForkWith(context.Background(), o); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ForkWith(%+v) = %v, want invalid argument", o, err)
		}
	}
}

func TestBuildsAreCappedNotQueued(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	r1, err := e.acquireBuild("a", "", TenantQuota{})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.acquireBuild("b", "", TenantQuota{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.acquireBuild("c", "", TenantQuota{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("third build: %v, want resource exhausted", err)
	}
	r1()
	r3, err := e.acquireBuild("c", "", TenantQuota{})
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	r2()
	r3()
}

func TestRecipeByNameOrContentNeverByHostPath(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	for _, name := range []string{"/etc/passwd", "../recipes/minimal", "x.toml"} {
		if _, err := e.ResolveRecipe(name, ""); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "recipe_toml") {
			t.Errorf("ResolveRecipe(%q) = %v, want a refusal naming recipe_toml", name, err)
		}
	}
	r, err := e.ResolveRecipe("", "name = 'inline'\nbase = 'busybox'\n")
	if err != nil || r.Name != "inline" {
		t.Fatalf("inline recipe: %+v %v", r, err)
	}
	if _, err := e.ResolveRecipe("a", "name='a'"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("both given: %v", err)
	}
	if _, err := e.ResolveRecipe("", ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("neither given: %v", err)
	}
}

// TestForkRefusesAnotherVMMRelease: a snapshot written by a VMM release
// the driver cannot restore is refused before any VMM starts, naming
// why, and its pool is not warmed.
func TestForkRefusesAnotherVMMRelease(t *testing.T) {
	d := &fakeDriver{restorable: func(v string) error {
		if v == "old" {
			return fmt.Errorf("written by old, this host runs new: %w", errdefs.ErrFailedPrecondition)
		}
		return nil
	}}
	e, _ := newFakeEngine(t, d, 0)
	st, err := e.Store().Stage("old-base")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{snapshot.StateFile, snapshot.MemoryFile} {
		os.WriteFile(filepath.Join(st.Dir, f), []byte(f), 0o600)
	}
	if _, err := st.Commit(snapshot.Manifest{VMM: snapshot.VMMRef{Kind: "fake", Version: "old"}, MemoryMiB: 64, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = e.Fork(context.Background(), "old-base", 1)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `snapshot "old-base": written by old`) {
		t.Errorf("fork of a snapshot of another release: %v", err)
	}
	if err := e.Warm("old-base"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("warming its pool: %v", err)
	}
	if n := d.alive(); n != 0 {
		t.Errorf("%d VMMs started for a snapshot that cannot be restored", n)
	}
	if _, err := e.Fork(context.Background(), "base", 1); err != nil {
		t.Errorf("a snapshot of this release: %v", err)
	}
}
