package loadtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// checkPlacements asserts every live Sandbox is Running on a node that
// holds its snapshot and runs it there, and that no node holds more than
// its memory: neither in the controller's reservations as the objects and
// bare reservations add up, nor on the stand-in, which refused no fork.
func checkPlacements(t *testing.T, ctx context.Context, c client.Client, s scale, nodes []StandInNode, stand *FleetStandIn, bare int) {
	t.Helper()
	var list v1.SandboxList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	if want := s.objects + 2*s.batch + s.single; len(list.Items) != want {
		t.Errorf("%d Sandboxes, want %d (preloaded, batch, claims, single claims)", len(list.Items), want)
	}
	reserved := map[string]int64{}
	for _, sb := range list.Items {
		st := sb.Status
		switch {
		case st.Phase != v1.SandboxRunning:
			t.Errorf("%s/%s: phase %q, want Running", sb.Namespace, sb.Name, st.Phase)
		case !stand.Holds(st.NodeName, sb.Spec.Snapshot.Tag):
			t.Errorf("%s/%s: Running on %s, which does not hold %s", sb.Namespace, sb.Name, st.NodeName, sb.Spec.Snapshot.Tag)
		default:
			if tag, _, ok := stand.Sandbox(st.NodeName, st.SandboxID); !ok || tag != sb.Spec.Snapshot.Tag {
				t.Errorf("%s/%s: node %s runs no %s sandbox %s", sb.Namespace, sb.Name, st.NodeName, sb.Spec.Snapshot.Tag, st.SandboxID)
			}
		}
		reserved[st.NodeName] += sandboxMem
	}
	perNode := s.view / s.nodes
	var total int64
	for i, n := range nodes {
		objs := s.objects / s.nodes
		if i < s.objects%s.nodes {
			objs++
		}
		r := reserved[n.Name] + int64(max(0, perNode-objs))*sandboxMem
		total += r
		committed, limit, refused := stand.Usage(n.Name)
		if r > limit || committed > limit {
			t.Errorf("%s: %d MiB reserved, %d MiB committed on the node, limit %d MiB", n.Name, r>>20, committed>>20, limit>>20)
		}
		if committed != r {
			t.Errorf("%s: the node runs %d MiB of sandboxes, the apiserver and the bare reservations say %d MiB", n.Name, committed>>20, r>>20)
		}
		if refused > 0 {
			t.Errorf("%s refused %d forks for want of memory: placement overcommitted it", n.Name, refused)
		}
	}
	if want := int64(s.objects+bare+2*s.batch+s.single) * sandboxMem; total != want {
		t.Errorf("%d MiB reserved over the nodes, want %d MiB", total>>20, want>>20)
	}
}

// checkClaims asserts every claim is bound to its Running Sandbox.
func checkClaims(t *testing.T, ctx context.Context, c client.Client, n int) {
	t.Helper()
	waitFor(t, time.Minute, "every claim Ready", func() bool {
		var list v1.SandboxClaimList
		if err := c.List(ctx, &list); err != nil {
			return false
		}
		ready := 0
		for _, cl := range list.Items {
			if meta.IsStatusConditionTrue(cl.Status.Conditions, v1.ConditionReady) && cl.Status.Sandbox.SandboxID != "" {
				ready++
			}
		}
		return ready == n
	})
}

// parallel runs f(0..n-1) on createConns goroutines and fails t on the
// first error.
func parallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range createConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("item %d: %w", i, err) })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		<-tick.C
	}
}

func uniq(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
