package controller

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/placement"
)

// writeLog records the Sandbox reconciler's writes to the apiserver.
type writeLog struct {
	mu     sync.Mutex
	writes []string
}

func (w *writeLog) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, s)
}

func (w *writeLog) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.writes
	w.writes = nil
	return out
}

// countWrites has the Sandbox reconciler write through a client that
// logs each write, as "update NAME" or "status NAME".
func (e *testEnv) countWrites() *writeLog {
	w := &writeLog{}
	e.sbr.Client = interceptor.NewClient(e.client.(client.WithWatch), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			w.add("update " + obj.GetName())
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			w.add("patch " + obj.GetName())
			return c.Patch(ctx, obj, p, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			w.add(sub + " " + obj.GetName())
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	return w
}

// TestClaimCreatesItsSandboxBound: a claim whose snapshot a node holds
// creates its Sandbox bound to that node (spec.nodeName, as a scheduler
// binds a Pod) and with the finalizer, so the Sandbox reconciler's one
// write is the Running status after the fork: the claim path's writes
// are the Create, that status and the claim's own.
func TestClaimCreatesItsSandboxBound(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 4 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 16 * gib, snapshots: map[string]int{"js": 512}})
	e.poll() // settled: Preplace binds only then
	writes := e.countWrites()
	e.createTemplate("py", "py")
	e.createClaim("job", "py")
	e.reconcileClaim("job")
	sb := e.get("job")
	if sb.Spec.NodeName != "n1" || !slices.Equal(sb.Finalizers, []string{Finalizer}) {
		t.Fatalf("Sandbox created with spec.nodeName %q, finalizers %q; want bound to n1, the holder, with %q",
			sb.Spec.NodeName, sb.Finalizers, Finalizer)
	}
	// Its room is reserved from the Create on (placing its key again
	// answers the first decision).
	if d, err := e.nodes.Cluster.Place(placement.Request{Key: "default/job", Snapshot: "js", MemoryBytes: 1}); err != nil || d.Node != "n1" {
		t.Errorf("the bound Sandbox's reservation: %+v, %v; want it on n1", d, err)
	}

	e.reconcile("job")
	got := e.get("job")
	if got.Status.Phase != v1.SandboxRunning || got.Status.NodeName != "n1" || got.Status.SandboxID == "" {
		t.Fatalf("status %+v, want Running on n1", got.Status)
	}
	wantCondition(t, got.Status.Conditions, v1.ConditionPlaced, metav1.ConditionTrue, ReasonPinned)
	if w := writes.take(); !slices.Equal(w, []string{"status job"}) {
		t.Fatalf("the Sandbox reconciler wrote %q, want only the Running status", w)
	}
	e.reconcileClaim("job")
	wantCondition(t, e.getClaim("job").Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked)
}

// TestBoundSandboxLostBeforeItsFork: a claim's Sandbox bound to a node
// that is lost before the fork (its status names no node yet) is found
// by the node index and marked Lost, so the claim replaces it elsewhere;
// deleting it asks nothing of the gone node.
func TestBoundSandboxLostBeforeItsFork(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 4 * gib, snapshots: map[string]int{"py": 512}})
	e.poll()
	e.createTemplate("py", "py")
	e.createClaim("job", "py")
	e.reconcileClaim("job")
	if n := e.get("job").Spec.NodeName; n != "n1" {
		t.Fatalf("bound to %q, want n1 (the holder with the most room)", n)
	}
	e.standIn["n1"].setDown(true)
	e.poll()
	e.poll() // lost
	lost := e.get("job")
	if lost.Status.Phase != v1.SandboxLost || lost.Status.NodeName != "n1" {
		t.Fatalf("status %+v, want Lost on n1", lost.Status)
	}
	e.reconcileClaim("job")
	c := e.getClaim("job")
	repl := c.Status.Sandbox.Name
	if repl == "" || repl == "job" {
		t.Fatalf("claim status %+v: want a replacement Sandbox", c.Status)
	}
	e.reconcileClaim("job")
	if n := e.get(repl).Spec.NodeName; n != "n2" {
		t.Fatalf("replacement bound to %q, want n2", n)
	}
	if f, _, _ := e.standIn["n1"].counts(); f != 0 {
		t.Fatalf("%d forks on the lost node", f)
	}
}

// TestPinnedToAnUnknownNode: once the node view has settled, a Sandbox
// pinned to a node where no daemon runs is Lost (as Kubernetes' pod GC
// treats a Pod bound to a node that does not exist), not left waiting.
func TestPinnedToAnUnknownNode(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.poll() // settled: two rounds
	sb := newSandbox("typo", "py")
	sb.Spec.NodeName = "n9"
	e.create(sb)
	e.reconcile("typo")
	got := e.get("typo")
	if got.Status.Phase != v1.SandboxLost {
		t.Fatalf("status %+v, want Lost", got.Status)
	}
	wantCondition(t, got.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonNodeLost)
}

// TestClaimReadPastTheCacheBeforeItTakes: when the cached claim names no
// Sandbox but the apiserver's does (the cache behind the claim's own
// status write), the claim takes nothing from its pool; it waits for the
// cache. A claim with nothing to take forks with no read past the cache:
// its Sandbox is named as the claim, so a second create finds the first.
func TestClaimReadPastTheCacheBeforeItTakes(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.poll()
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 1)
	e.fillPool("pool")
	e.createClaim("job", "py")
	var apiReads int
	bound := "taken-earlier" // what the cache has not shown yet
	e.claims.Reader = interceptor.NewClient(e.client.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			err := c.Get(ctx, key, obj, opts...)
			if cl, ok := obj.(*v1.SandboxClaim); ok && err == nil {
				apiReads++
				cl.Status.Sandbox.Name = bound
			}
			return err
		},
	})
	res, err := e.claims.Reconcile(e.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "job"}})
	if err != nil || res.RequeueAfter == 0 {
		t.Fatalf("reconcile: %+v, %v; want a requeue", res, err)
	}
	if taken := e.sandboxes(client.MatchingLabels{LabelClaim: "job"}); len(taken) != 0 || apiReads != 1 {
		t.Fatalf("%d Sandboxes taken or made, %d claim reads past the cache; want none after one read", len(taken), apiReads)
	}

	// With the apiserver's claim as the cache's, it takes the pool's.
	bound = ""
	e.reconcileClaim("job")
	if c := e.getClaim("job"); c.Status.Sandbox.Name == "" || c.Status.Sandbox.Name == "job" || apiReads != 2 {
		t.Fatalf("claim bound to %+v after %d reads, want the pool's Sandbox after 2", c.Status.Sandbox, apiReads)
	}

	// Nothing left to take (the pool not refilled): forked, not read.
	e.createClaim("other", "py")
	e.reconcileClaim("other")
	if sb := e.get("other"); sb.Spec.NodeName != "n1" || apiReads != 2 {
		t.Fatalf("Sandbox %+v after %d reads, want bound to n1 with no read past the cache", sb.Spec, apiReads)
	}
}

// TestPreplaceGivesBackOnlyItsOwn: Preplace binds nothing before the node
// view has settled, nothing for a key placed already (another Sandbox of
// that name reserves for itself), and a failed Create gives back only
// the room Preplace reserved.
func TestPreplaceGivesBackOnlyItsOwn(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	early := newSandbox("early", "py")
	e.sbr.Preplace(early)
	if early.Spec.NodeName != "" {
		t.Fatalf("bound to %q before the node view settled", early.Spec.NodeName)
	}
	e.poll()

	// A Sandbox named x holds a reservation; a create of another x
	// (a retried gateway fork, a name clash) neither binds nor frees it.
	if _, err := e.nodes.Cluster.Place(placement.Request{Key: "default/x", Snapshot: "py", MemoryBytes: gib}); err != nil {
		t.Fatal(err)
	}
	x := newSandbox("x", "py")
	e.sbr.Preplace(x)(apierrors.NewAlreadyExists(v1.GroupVersion.WithResource("sandboxes").GroupResource(), "x"))
	if x.Spec.NodeName != "" {
		t.Fatalf("a Sandbox whose key is placed was bound to %q", x.Spec.NodeName)
	}
	if _, err := e.nodes.Cluster.Place(placement.Request{Key: "default/x", Snapshot: "py", MemoryBytes: gib, OnlyNew: true}); !errors.Is(err, placement.ErrPlaced) {
		t.Fatalf("the other Sandbox's reservation: %v, want it still held", err)
	}

	// Its own reservation, given back when the Create fails.
	y := newSandbox("y", "py")
	created := e.sbr.Preplace(y)
	if y.Spec.NodeName != "n1" {
		t.Fatalf("y bound to %q, want n1", y.Spec.NodeName)
	}
	created(errors.New("apiserver away"))
	if _, err := e.nodes.Cluster.Place(placement.Request{Key: "default/y", Snapshot: "py", MemoryBytes: gib, OnlyNew: true}); err != nil {
		t.Fatalf("y's reservation after its failed Create: %v, want it given back", err)
	}
}
