package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestForkCPULimit: a fork's CPU limit reaches each child's VMM, pooled
// or not, before it runs, and shows in its info; out of range is refused
// before any VMM is taken.
func TestForkCPULimit(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 1)
	e.Warm("base")
	waitFor(t, func() bool { return e.PoolSize(e.mustSnap(t, "base").ID) == 1 })
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 2, CPUMillicores: 500})
	if err != nil {
		t.Fatal(err)
	}
	pooled := 0
	for _, s := range sbs {
		if s.Pooled {
			pooled++
		}
		if got := s.machine.(*fakeMachine).cpu.Load(); got != 500 {
			t.Errorf("%s (pooled %v): VMM CPU limit %d, want 500", s.ID, s.Pooled, got)
		}
		if info := s.Info(); info.CPUs != 0.5 {
			t.Errorf("%s: info cpus %v, want 0.5", s.ID, info.CPUs)
		}
	}
	if pooled != 1 {
		t.Errorf("%d pooled children, want 1", pooled)
	}
	// The default leaves the VMM's own limit alone.
	def, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := def[0].machine.(*fakeMachine).cpu.Load(); got != 0 || def[0].Info().CPUs != 0 {
		t.Errorf("default fork: VMM CPU limit %d, info %v", got, def[0].Info().CPUs)
	}
	d.mu.Lock()
	before := len(d.machines)
	d.mu.Unlock()
	for _, m := range []int64{50, 1001} { // the snapshot has 1 vCPU
		if _, err := e.ForkWith(ctx, ForkOptions{Tag: "base", Count: 1, CPUMillicores: m}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("cpus %d millicores: %v, want invalid argument", m, err)
		}
	}
	d.mu.Lock()
	after := len(d.machines)
	d.mu.Unlock()
	if after > before+1 { // a pool refill may start one
		t.Errorf("refused forks started VMMs: %d -> %d", before, after)
	}
}

// TestForkCPULimitFromRecipe: a snapshot's default CPU limit (its
// recipe's cpus) applies to forks that ask for none; a fork may ask for
// another.
func TestForkCPULimitFromRecipe(t *testing.T) {
	d := &fakeDriver{}
	e, _ := newFakeEngine(t, d, 0)
	st, err := e.Store().Stage("capped")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{snapshot.StateFile, snapshot.MemoryFile} {
		os.WriteFile(filepath.Join(st.Dir, f), []byte(f), 0o600)
	}
	if _, err := st.Commit(snapshot.Manifest{VMM: snapshot.VMMRef{Kind: "fake"}, MemoryMiB: 64, VCPUs: 2, CPUMillicores: 300}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct{ ask, want int64 }{{0, 300}, {1500, 1500}} {
		sbs, err := e.ForkWith(ctx, ForkOptions{Tag: "capped", Count: 1, CPUMillicores: c.ask})
		if err != nil {
			t.Fatal(err)
		}
		if got := sbs[0].machine.(*fakeMachine).cpu.Load(); got != c.want || sbs[0].Info().CPUs != float64(c.want)/1000 {
			t.Errorf("asked %d: VMM limit %d, info %v; want %d", c.ask, got, sbs[0].Info().CPUs, c.want)
		}
	}
}
