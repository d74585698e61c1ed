package controller

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// claimStatusWrites has the claim reconciler write through a client that
// logs each of its status writes, by the claim's Ready reason.
func (e *testEnv) claimStatusWrites() *writeLog {
	w := &writeLog{}
	e.claims.Client = interceptor.NewClient(e.client.(client.WithWatch), interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if cl, ok := obj.(*v1.SandboxClaim); ok {
				reason := ""
				for _, cond := range cl.Status.Conditions {
					if cond.Type == v1.ConditionReady {
						reason = cond.Reason
					}
				}
				w.add(cl.Name + " " + reason)
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	return w
}

// reconcileClaimOnce runs the claim reconciler once, as one event would
// (reconcileClaim also passes a first status's wait).
func (e *testEnv) reconcileClaimOnce(name string) ctrl.Result {
	e.t.Helper()
	res, err := e.claims.Reconcile(e.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}})
	if err != nil {
		e.t.Fatalf("reconcile claim %s: %v", name, err)
	}
	return res
}

// hideFromClaims has the claim reconciler's cache list no Sandbox hide
// holds for (a cache behind their creates), and Get claim name as stale
// when stale is not nil (a cache behind the claim's status writes).
func (e *testEnv) hideFromClaims(hide func(*v1.Sandbox) bool, name string, stale *v1.SandboxClaim) {
	e.claims.Client = interceptor.NewClient(e.client.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if cl, ok := obj.(*v1.SandboxClaim); ok && stale != nil && key.Name == name {
				stale.DeepCopyInto(cl)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if l, ok := list.(*v1.SandboxList); ok {
				l.Items = slices.DeleteFunc(l.Items, func(sb v1.Sandbox) bool { return hide(&sb) })
			}
			return nil
		},
	})
}

// newWaitingClaim is one settled node holding py, template py and a
// claim of it named name, reconciled once: its Sandbox created, its first
// status waiting for the Sandbox's news.
func newWaitingClaim(t *testing.T, name string) *testEnv {
	t.Helper()
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.poll()
	e.createTemplate("py", "py")
	e.createClaim(name, "py")
	e.reconcileClaimOnce(name)
	return e
}

// TestClaimFirstStatusWaitsForItsSandbox: a claim that creates its
// Sandbox writes no status until the Sandbox has news, so a quick fork's
// claim is written once, Ready, with the WarmPool condition its create
// set; a Sandbox with no news after firstStatusWait is shown pending.
func TestClaimFirstStatusWaitsForItsSandbox(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.poll()
	e.createTemplate("py", "py")
	writes := e.claimStatusWrites()
	e.createClaim("quick", "py")
	if res := e.reconcileClaimOnce("quick"); res.RequeueAfter != firstStatusWait {
		t.Fatalf("first reconcile: %+v; want a requeue after %v", res, firstStatusWait)
	}
	if w := writes.take(); len(w) != 0 || e.get("quick").Spec.NodeName != "n1" {
		t.Fatalf("claim status writes %q; want none yet, with its Sandbox created bound", w)
	}
	// Woken again by its Sandbox's create: still nothing to say.
	if res := e.reconcileClaimOnce("quick"); res.RequeueAfter != firstStatusWait {
		t.Fatalf("second reconcile: %+v; want the same wait", res)
	}
	e.reconcile("quick") // forked: Running
	e.reconcileClaim("quick")
	if w := writes.take(); !slices.Equal(w, []string{"quick " + v1.ReasonForked}) {
		t.Fatalf("claim status writes %q, want one, Ready", w)
	}
	c := e.getClaim("quick")
	wantCondition(t, c.Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonNoPool)
	if c.Status.Sandbox.Name != "quick" || c.Status.Sandbox.SandboxID == "" || e.claims.created.len() != 0 {
		t.Fatalf("claim status %+v, %d creates remembered; want bound, none", c.Status.Sandbox, e.claims.created.len())
	}

	// No news within the wait: the claim says which Sandbox, pending.
	e.createClaim("slow", "py")
	e.reconcileClaimOnce("slow")
	e.now = e.now.Add(firstStatusWait / 2)
	if res := e.reconcileClaimOnce("slow"); res.RequeueAfter != firstStatusWait/2 {
		t.Fatalf("halfway: %+v; want the rest of the wait", res)
	}
	e.now = e.now.Add(firstStatusWait / 2)
	e.reconcileClaimOnce("slow")
	if w := writes.take(); !slices.Equal(w, []string{"slow SandboxNotReady"}) {
		t.Fatalf("claim status writes %q, want one, not ready", w)
	}
	if c := e.getClaim("slow"); c.Status.Sandbox.Name != "slow" {
		t.Fatalf("claim status %+v, want it to name Sandbox slow", c.Status.Sandbox)
	}
}

// TestClaimBindsItsNewSandboxBehindTheCache: while a claim's status waits,
// a reconcile whose cache does not show the Sandbox it created binds that
// one, not a warm pool's (the status that guarded against it is not
// written yet).
func TestClaimBindsItsNewSandboxBehindTheCache(t *testing.T) {
	e := newWaitingClaim(t, "job")
	// A pool fills; the claim's cache lists no Sandbox of the claim.
	e.createPool("pool", "py", 1)
	e.fillPool("pool")
	e.hideFromClaims(func(sb *v1.Sandbox) bool { return sb.Labels[LabelClaim] == "job" }, "", nil)
	e.claims.Reader = e.client
	e.now = e.now.Add(firstStatusWait)
	e.reconcileClaimOnce("job")
	if c := e.getClaim("job"); c.Status.Sandbox.Name != "job" {
		t.Fatalf("claim bound to %q, want the Sandbox it created", c.Status.Sandbox.Name)
	}
	if n := len(e.sandboxes(client.MatchingLabels{LabelPool: "pool"})); n != 1 {
		t.Fatalf("%d pool Sandboxes, want the pool's 1 untaken", n)
	}
}

// TestStaleClaimAfterAReplacementCreatesNothing: a claim's Sandbox lost
// before the claim's status named it is replaced (the claim's first
// write names the replacement) and the lost one deleted; a reconcile
// whose cache shows neither that write nor the replacement reads the
// claim past the cache and creates no second Sandbox under the freed
// name.
func TestStaleClaimAfterAReplacementCreatesNothing(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.poll()
	e.createTemplate("py", "py")
	e.createClaim("c", "py")
	e.claims.Reader = e.client
	stale := e.getClaim("c") // as the cache will keep showing it
	e.reconcileClaimOnce("c")
	e.standIn[e.get("c").Spec.NodeName].setDown(true)
	e.poll()
	e.poll() // threshold 2: lost
	if p := e.get("c").Status.Phase; p != v1.SandboxLost {
		t.Fatalf("phase %s, want Lost", p)
	}
	e.reconcileClaimOnce("c") // replaces
	if c := e.getClaim("c"); c.Status.Sandbox.Name != "c-r1" {
		t.Fatalf("claim status %+v, want it to name c-r1", c.Status.Sandbox)
	}
	e.reconcile("c") // the lost one's finalizer: gone

	e.hideFromClaims(func(sb *v1.Sandbox) bool { return sb.Name == "c-r1" }, "c", stale)
	e.reconcileClaimOnce("c")
	var names []string
	for _, sb := range e.sandboxes(client.MatchingLabels{LabelClaim: "c"}) {
		names = append(names, sb.Name)
	}
	if !slices.Equal(names, []string{"c-r1"}) {
		t.Fatalf("the claim's Sandboxes %q, want only c-r1", names)
	}
}

// TestNewSandboxDeletedBeforeTheClaimNamedIt: a Sandbox deleted while its
// claim's first status still waited ends the claim (SandboxGone), as a
// bound one deleted does; it is not forked again.
func TestNewSandboxDeletedBeforeTheClaimNamedIt(t *testing.T) {
	e := newWaitingClaim(t, "c")
	if err := e.client.Delete(e.ctx, e.get("c")); err != nil {
		t.Fatal(err)
	}
	e.reconcile("c") // its finalizer: gone
	e.reconcileClaim("c")
	e.reconcileClaim("c")
	c := e.getClaim("c")
	wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonSandboxGone)
	if n := len(e.sandboxes(nil)); n != 0 || c.Status.Sandbox.Name != "c" {
		t.Fatalf("%d Sandboxes, claim names %q; want none, c", n, c.Status.Sandbox.Name)
	}
}

// TestClaimAfterARestartDuringItsWait: a controller restarted while a
// claim's first status waited (nothing remembered of its create) binds
// the Sandbox it finds and still says why it forked.
func TestClaimAfterARestartDuringItsWait(t *testing.T) {
	e := newWaitingClaim(t, "c")
	e.claims.created = newSandboxes{} // restarted
	e.reconcileClaim("c")
	c := e.getClaim("c")
	if c.Status.Sandbox.Name != "c" {
		t.Fatalf("claim status %+v, want it to name Sandbox c", c.Status.Sandbox)
	}
	wantCondition(t, c.Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonNoPool)
	if n := len(e.sandboxes(nil)); n != 1 {
		t.Fatalf("%d Sandboxes, want the one made before the restart", n)
	}
}
