package loadtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// batchRun is one batch's timings, per object, from just before its
// create call: to its Sandbox seen Running by a watch, and for claims to
// the claim seen Ready; overheads are create to Running less the fork time
// the node reported.
type batchRun struct {
	n                int
	first, last      time.Time
	createToRunnings []time.Duration
	overheads        []time.Duration
	forkMs           []float64
	claimReady       []time.Duration
}

func (b batchRun) log(t *testing.T, what string) {
	t.Helper()
	span := b.last.Sub(b.first)
	t.Logf("%s: %d in %v (%.1f/s); create to Sandbox Running p50 %v p99 %v max %v; less the stand-in's fork time (p50 %.2f ms): p50 %v p99 %v max %v",
		what, b.n, span.Round(time.Millisecond), float64(b.n)/span.Seconds(),
		pct(b.createToRunnings, 0.5), pct(b.createToRunnings, 0.99), pct(b.createToRunnings, 1),
		pctF(b.forkMs, 0.5), pct(b.overheads, 0.5), pct(b.overheads, 0.99), pct(b.overheads, 1))
	if len(b.claimReady) > 0 {
		t.Logf("%s: create to claim Ready p50 %v p99 %v max %v", what,
			pct(b.claimReady, 0.5), pct(b.claimReady, 0.99), pct(b.claimReady, 1))
	}
}

// runBatch creates one object per tag with newObj (a Sandbox, or a claim
// whose Sandbox has its name) in ns, all at once or oneByOne (each once
// the last is done), and waits for every Sandbox of ns to be Running and,
// for claims, every claim Ready. The last done ends the batch.
func runBatch(t *testing.T, ctx context.Context, c client.WithWatch, s scale, ns string, tags []string,
	stand *FleetStandIn, oneByOne bool, newObj func(i int, tag string) client.Object) batchRun {
	t.Helper()
	_, claims := newObj(0, tags[0]).(*v1.SandboxClaim)
	var mu sync.Mutex
	created := map[string]time.Time{}
	running := map[string]time.Time{}
	ready := map[string]time.Time{}
	nodeOf := map[string][2]string{} // name -> node, sandbox id
	watchInto(t, ctx, c, &v1.SandboxList{}, ns, func(obj client.Object, now time.Time) {
		sb := obj.(*v1.Sandbox)
		if sb.Status.Phase != v1.SandboxRunning {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, seen := running[sb.Name]; !seen {
			running[sb.Name] = now
			nodeOf[sb.Name] = [2]string{sb.Status.NodeName, sb.Status.SandboxID}
		}
	})
	if claims {
		watchInto(t, ctx, c, &v1.SandboxClaimList{}, ns, func(obj client.Object, now time.Time) {
			cl := obj.(*v1.SandboxClaim)
			if !meta.IsStatusConditionTrue(cl.Status.Conditions, v1.ConditionReady) || cl.Status.Sandbox.SandboxID == "" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if _, seen := ready[cl.Name]; !seen {
				ready[cl.Name] = now
			}
		})
	}
	doneBy := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(running) >= n && (!claims || len(ready) >= n)
		}
	}
	create := func(i int) error {
		obj := newObj(i, tags[i])
		mu.Lock()
		created[obj.GetName()] = time.Now()
		mu.Unlock()
		return c.Create(ctx, obj)
	}
	if oneByOne {
		for i := range tags {
			if err := create(i); err != nil {
				t.Fatal(err)
			}
			waitFor(t, s.deadline, fmt.Sprintf("%s: %d done", ns, i+1), doneBy(i+1))
		}
	} else {
		parallel(t, len(tags), create)
		waitFor(t, s.deadline, fmt.Sprintf("%s: %d done", ns, len(tags)), doneBy(len(tags)))
	}
	mu.Lock()
	defer mu.Unlock()
	b := batchRun{n: len(tags)}
	for name, at := range created {
		if b.first.IsZero() || at.Before(b.first) {
			b.first = at
		}
		end := running[name]
		if claims {
			b.claimReady = append(b.claimReady, ready[name].Sub(at))
			end = later(end, ready[name])
		}
		b.last = later(b.last, end)
		_, forkMs, ok := stand.Sandbox(nodeOf[name][0], nodeOf[name][1])
		if !ok {
			t.Errorf("%s/%s: Running as %s on %s, which the stand-in does not hold", ns, name, nodeOf[name][1], nodeOf[name][0])
		}
		d := running[name].Sub(at)
		b.createToRunnings = append(b.createToRunnings, d)
		b.forkMs = append(b.forkMs, forkMs)
		b.overheads = append(b.overheads, d-time.Duration(forkMs*float64(time.Millisecond)))
	}
	return b
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// watchInto watches list's kind in ns until the test ends, calling seen
// with each object added or changed and when the event arrived. A watch
// the apiserver closes is started again from a fresh list.
func watchInto(t *testing.T, ctx context.Context, c client.WithWatch, list client.ObjectList, ns string, seen func(client.Object, time.Time)) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	start := func() watch.Interface {
		w, err := c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), client.InNamespace(ns))
		if err != nil {
			t.Fatalf("watch %T in %s: %v", list, ns, err)
		}
		return w
	}
	w := start()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for ev := range w.ResultChan() {
				if obj, ok := ev.Object.(client.Object); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					seen(obj, time.Now())
				}
			}
			w.Stop()
			if ctx.Err() != nil {
				return
			}
			var err error
			if w, err = c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), client.InNamespace(ns)); err != nil {
				return
			}
		}
	}()
}
