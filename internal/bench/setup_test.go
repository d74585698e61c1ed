package bench

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestBenchFlags(t *testing.T) {
	if got, err := parseSizes("256, 1024"); err != nil || !slices.Equal(got, []int{256, 1024}) {
		t.Errorf("--memory 256, 1024: %v %v", got, err)
	}
	if got, err := parseDirties("0,64"); err != nil || !slices.Equal(got, []int{0, 64}) {
		t.Errorf("--dirty-mb 0,64: %v %v", got, err)
	}
	for _, bad := range []string{"", "32", "lots"} {
		if _, err := parseSizes(bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--memory") {
			t.Errorf("--memory %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"", "-1", "64MB"} {
		if _, err := parseDirties(bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--dirty-mb") {
			t.Errorf("--dirty-mb %q: %v", bad, err)
		}
	}
	if got, err := parseConcurrent(" 10, 50,"); err != nil || !slices.Equal(got, []int{10, 50}) {
		t.Errorf("--concurrent 10,50: %v %v", got, err)
	}
	for _, bad := range []string{"0", "ten"} {
		if _, err := parseConcurrent(bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--concurrent") {
			t.Errorf("--concurrent %q: %v", bad, err)
		}
	}
}

// fakePools is a pool that fills one VMM per PoolSize call up to full.
type fakePools struct {
	ready  atomic.Int64
	full   int64
	target int
}

func (p *fakePools) PoolSize(string) int {
	n := p.ready.Load()
	if n < p.full {
		p.ready.Add(1)
	}
	return int(n)
}

func (p *fakePools) PoolTarget(string) int { return p.target }

// waitPool waits for the grown target, not just the base size, and says
// nothing when the pool fills.
func TestWaitPoolWaitsForTheGrownTarget(t *testing.T) {
	p := &fakePools{full: 5, target: 5}
	var said []string
	waitPool(p, "snap", 2, 10*time.Minute, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })
	if n := p.ready.Load(); n != 5 {
		t.Fatalf("returned with %d ready, want the target 5", n)
	}
	if len(said) != 0 {
		t.Fatalf("said %q of a pool that filled", said)
	}
}

// A pool that does not fill within the limit is measured anyway, and the
// run says so.
func TestWaitPoolSaysAPartialPool(t *testing.T) {
	p := &fakePools{full: 1, target: 2}
	var said []string
	waitPool(p, "snap", 3, 200*time.Millisecond, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })
	if len(said) != 1 || !strings.Contains(said[0], "held 1 of 3 VMMs") {
		t.Fatalf("said %q, want the pool held 1 of 3", said)
	}
}

// Progress lines from many goroutines are whole lines, each prefixed.
func TestSayWritesWholeLines(t *testing.T) {
	var b strings.Builder
	say := newSay(&b)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); say("client %d: %s", i, strings.Repeat("x", 100)) }()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 20 {
		t.Fatalf("%d lines, want 20:\n%s", len(lines), b.String())
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "bench: client ") || !strings.HasSuffix(l, strings.Repeat("x", 100)) {
			t.Fatalf("line %q", l)
		}
	}
	newSay(nil)("no writer: dropped") // must not panic
}
