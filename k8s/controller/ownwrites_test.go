package controller

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// laggingCache makes the Sandbox reconciler's cache answer Sandbox Gets
// with the copy frozen while frozen is set (a cache behind the
// reconciler's own writes), and counts its reads past the cache.
type laggingCache struct {
	frozen   map[types.NamespacedName]*v1.Sandbox
	apiReads int
}

func (l *laggingCache) install(e *testEnv) {
	l.frozen = map[types.NamespacedName]*v1.Sandbox{}
	base := e.client.(client.WithWatch)
	e.sbr.Client = interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if sb, ok := obj.(*v1.Sandbox); ok && l.frozen[key] != nil {
				l.frozen[key].DeepCopyInto(sb)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	e.sbr.Reader = interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			l.apiReads++
			return c.Get(ctx, key, obj, opts...)
		},
	})
}

// TestSandboxReadsPastTheCacheOnlyBehindItsOwnWrite: a Sandbox's first
// reconcile forks from the cached copy, with no read past the cache on
// the fork's path; a reconcile whose cache does not yet show the Running
// status it wrote reads the apiserver's copy and forks nothing again;
// once the cache shows the write, the record of it ends.
func TestSandboxReadsPastTheCacheOnlyBehindItsOwnWrite(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	var lag laggingCache
	lag.install(e)
	e.create(newSandbox("a", "py"))
	key := types.NamespacedName{Namespace: "default", Name: "a"}
	lag.frozen[key] = e.get("a") // the cache never moves past the create

	e.reconcile("a")
	if forks, _, _ := e.standIn["n1"].counts(); forks != 1 || lag.apiReads != 0 {
		t.Fatalf("first reconcile: %d forks, %d reads past the cache; want 1 fork and no read", forks, lag.apiReads)
	}
	if sb := e.get("a"); sb.Status.Phase != v1.SandboxRunning {
		t.Fatalf("status %+v, want Running", sb.Status)
	}

	// The cache still shows the Sandbox as created.
	e.reconcile("a")
	if forks, _, _ := e.standIn["n1"].counts(); forks != 1 || lag.apiReads != 1 {
		t.Fatalf("with the cache behind: %d forks, %d reads past the cache; want still 1 fork, after 1 read", forks, lag.apiReads)
	}
	if e.sbr.writes.len() != 1 {
		t.Fatalf("%d writes remembered, want the Running one until the cache shows it", e.sbr.writes.len())
	}

	// Caught up: trusted again, and nothing is remembered.
	delete(lag.frozen, key)
	e.reconcile("a")
	if forks, _, _ := e.standIn["n1"].counts(); forks != 1 || lag.apiReads != 1 || e.sbr.writes.len() != 0 {
		t.Fatalf("with the cache caught up: %d forks, %d reads past the cache, %d writes remembered; want 1, 1, 0",
			forks, lag.apiReads, e.sbr.writes.len())
	}
}

// TestOwnWritesEndOnOthersWrites: a record ends when the apiserver's copy
// shows a value someone else wrote since, when another object takes the
// name, and when the object is gone.
func TestOwnWritesEndOnOthersWrites(t *testing.T) {
	var w ownWrites[progress]
	nn := types.NamespacedName{Namespace: "default", Name: "a"}
	running := progress{node: "n1", id: "sb-1", phase: v1.SandboxRunning}
	w.wrote(nn, "uid-a", running)

	if !w.behind(nn, "uid-a", progress{}) {
		t.Fatal("a cached copy without the Running write is not behind")
	}
	lost := running
	lost.phase = v1.SandboxLost
	w.settle(nn, "uid-a", lost) // written by another since
	if w.behind(nn, "uid-a", progress{}) || w.len() != 0 {
		t.Fatalf("after another's write: behind or %d records; want neither", w.len())
	}

	w.wrote(nn, "uid-a", running)
	w.settle(nn, "uid-a", running) // the apiserver shows it; the cache has yet to
	if !w.behind(nn, "uid-a", progress{}) {
		t.Fatal("settled by the apiserver's copy, the record ended before the cache showed it")
	}
	if w.behind(nn, "uid-a-again", progress{}) || w.len() != 0 {
		t.Fatal("another object of the same name is behind a write to the first")
	}

	w.wrote(nn, "uid-a", running)
	w.forget(nn)
	if w.len() != 0 {
		t.Fatal("an object gone is still remembered")
	}
}
