package controller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// withUIDs gives each object created through c a UID, as the apiserver
// does and the fake client does not: a Sandbox's fork is keyed by its UID.
func withUIDs(c client.WithWatch) client.WithWatch {
	var n atomic.Int64
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetUID() == "" {
				obj.SetUID(types.UID(fmt.Sprintf("uid-auto-%d", n.Add(1))))
			}
			return c.Create(ctx, obj, opts...)
		},
	})
}

func (e *testEnv) createTemplate(name, tag string) {
	e.t.Helper()
	e.create(&v1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1.SandboxTemplateSpec{SandboxBlueprint: v1.SandboxBlueprint{Snapshot: v1.SnapshotRef{Tag: tag}}},
	})
}

func (e *testEnv) createPool(name, template string, replicas int32) {
	e.t.Helper()
	e.create(&v1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1.SandboxWarmPoolSpec{Replicas: replicas, TemplateRef: v1.LocalRef{Name: template}},
	})
}

func (e *testEnv) createClaim(name, template string, mutate ...func(*v1.SandboxClaim)) {
	e.t.Helper()
	c := &v1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1.SandboxClaimSpec{TemplateRef: v1.LocalRef{Name: template}},
	}
	for _, m := range mutate {
		m(c)
	}
	e.create(c)
}

func (e *testEnv) getPool(name string) *v1.SandboxWarmPool {
	e.t.Helper()
	var p v1.SandboxWarmPool
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, &p); err != nil {
		e.t.Fatal(err)
	}
	return &p
}

func (e *testEnv) reconcilePool(name string) {
	e.t.Helper()
	if _, err := e.pools.Reconcile(e.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
		e.t.Fatalf("reconcile pool %s: %v", name, err)
	}
}

// sandboxes lists the Sandboxes matching labels.
func (e *testEnv) sandboxes(labels client.MatchingLabels) []v1.Sandbox {
	e.t.Helper()
	var list v1.SandboxList
	if err := e.client.List(e.ctx, &list, client.InNamespace("default"), labels); err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

// reconcileSandboxes runs the Sandbox reconciler on every Sandbox, as
// the manager would on their events: unforked ones fork, deleted ones
// finalize.
func (e *testEnv) reconcileSandboxes() {
	e.t.Helper()
	for _, sb := range e.sandboxes(nil) {
		e.reconcile(sb.Name)
	}
}

// fillPool brings a pool to its replicas, all Running.
func (e *testEnv) fillPool(name string) {
	e.t.Helper()
	e.reconcilePool(name)
	e.reconcileSandboxes()
	e.reconcilePool(name)
	p := e.getPool(name)
	if p.Status.Replicas != p.Spec.Replicas || p.Status.ReadyReplicas != p.Spec.Replicas {
		e.t.Fatalf("pool %s status %+v, want %d ready", name, p.Status, p.Spec.Replicas)
	}
}

func TestWarmPoolFillsAndScalesDown(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 3)

	e.fillPool("pool")
	got := e.sandboxes(client.MatchingLabels{LabelPool: "pool"})
	pool := e.getPool("pool")
	uids := map[types.UID]bool{}
	for _, sb := range got {
		if !metav1.IsControlledBy(&sb, pool) || sb.Labels[LabelTemplate] != "py" || sb.Spec.Snapshot.Tag != "py" {
			t.Fatalf("pool Sandbox %s: owners %+v labels %v spec %+v", sb.Name, sb.OwnerReferences, sb.Labels, sb.Spec)
		}
		uids[sb.UID] = true
	}
	if len(got) != 3 || len(uids) != 3 {
		t.Fatalf("%d pool Sandboxes (%d UIDs), want 3", len(got), len(uids))
	}
	if want := LabelPool + "=pool"; pool.Status.Selector != want {
		t.Fatalf("selector %q, want %q", pool.Status.Selector, want)
	}
	e.reconcilePool("pool")
	if f, created, _ := e.standIn["n1"].counts(); f != 3 || created != 3 || len(e.sandboxes(nil)) != 3 {
		t.Fatalf("after a second reconcile: %d forks, %d created, %d Sandboxes; want 3 each", f, created, len(e.sandboxes(nil)))
	}

	// Scale down to 1: two go, through their finalizers, on the node.
	pool.Spec.Replicas = 1
	if err := e.client.Update(e.ctx, pool); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool("pool")
	e.reconcileSandboxes()
	e.fillPool("pool")
	if n := len(e.sandboxes(nil)); n != 1 {
		t.Fatalf("%d Sandboxes after scaling to 1", n)
	}
	if _, _, dels := e.standIn["n1"].counts(); len(dels) != 2 {
		t.Fatalf("DELETEs on the node %v, want 2", dels)
	}

	// One dies on its node: the pool deletes it and forks another.
	dead := e.sandboxes(nil)[0]
	e.standIn["n1"].setState(dead.Status.SandboxID, "dead")
	e.reconcile(dead.Name)
	e.reconcilePool("pool")
	e.reconcileSandboxes()
	e.fillPool("pool")
	left := e.sandboxes(nil)
	if len(left) != 1 || left[0].Name == dead.Name {
		t.Fatalf("Sandboxes %v after one died, want one other", left)
	}
}

func TestClaimTakesFromPoolAndPoolRefills(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 2)
	e.fillPool("pool")

	e.createClaim("any", "py")                              // any pool of the template
	e.createClaim("named", "py", func(c *v1.SandboxClaim) { // the pool named
		c.Spec.WarmPoolRef = &v1.LocalRef{Name: "pool"}
	})
	for _, name := range []string{"any", "named"} {
		e.reconcileClaim(name)
		c := e.getClaim(name)
		sb := e.get(c.Status.Sandbox.Name)
		if !metav1.IsControlledBy(sb, c) || len(sb.OwnerReferences) != 1 {
			t.Fatalf("claim %s: Sandbox %s owners %+v, want the claim alone", name, sb.Name, sb.OwnerReferences)
		}
		if sb.Labels[LabelClaim] != name || sb.Labels[LabelPool] != "" {
			t.Fatalf("claim %s: Sandbox labels %v", name, sb.Labels)
		}
		if c.Status.Sandbox.SandboxID == "" || c.Status.Sandbox.SandboxID != sb.Status.SandboxID {
			t.Fatalf("claim %s: status.sandbox %+v, Sandbox %+v", name, c.Status.Sandbox, sb.Status)
		}
		wantCondition(t, c.Status.Conditions, ConditionWarmPool, metav1.ConditionTrue, ReasonTakenFromPool)
		wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked)
	}
	if f, _, _ := e.standIn["n1"].counts(); f != 2 {
		t.Fatalf("%d forks, want the pool's 2 (the claims took them)", f)
	}

	// The pool, woken by the takes, forks two more.
	e.fillPool("pool")
	if f, _, _ := e.standIn["n1"].counts(); f != 4 {
		t.Fatalf("%d forks after the refill, want 4", f)
	}
	if n := len(e.sandboxes(client.MatchingLabels{LabelPool: "pool"})); n != 2 {
		t.Fatalf("%d pool Sandboxes after the refill, want 2", n)
	}
}

func TestClaimForksWhenNoPoolSandboxIsReady(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createTemplate("js", "js")

	// No pool of the template at all.
	e.createClaim("nopool", "py")
	e.reconcileClaim("nopool")
	wantCondition(t, e.getClaim("nopool").Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonNoPool)

	// A pool whose Sandboxes are not forked yet.
	e.createPool("pool", "py", 1)
	e.reconcilePool("pool")
	e.createClaim("early", "py")
	e.reconcileClaim("early")
	c := e.getClaim("early")
	wantCondition(t, c.Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonNoneReady)
	if c.Status.Sandbox.Name != "early" || !metav1.IsControlledBy(e.get("early"), c) {
		t.Fatalf("claim bound to %q, want its own fresh Sandbox", c.Status.Sandbox.Name)
	}
	if n := len(e.sandboxes(client.MatchingLabels{LabelPool: "pool"})); n != 1 {
		t.Fatalf("%d pool Sandboxes, want the pool's 1 untouched", n)
	}

	// Ready now, but a claim whose timeout differs cannot take it (a
	// running microVM's timeout is fixed), nor one naming a pool of
	// another template.
	e.fillPool("pool")
	timeout := int64(60)
	e.createClaim("timeout", "py", func(c *v1.SandboxClaim) { c.Spec.Lifecycle = &v1.Lifecycle{TimeoutSeconds: &timeout} })
	e.reconcileClaim("timeout")
	wantCondition(t, e.getClaim("timeout").Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonNoneReady)
	e.createClaim("js", "js", func(c *v1.SandboxClaim) { c.Spec.WarmPoolRef = &v1.LocalRef{Name: "pool"} })
	e.reconcileClaim("js")
	wantCondition(t, e.getClaim("js").Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonPoolTemplateMismatch)
	if n := len(e.sandboxes(client.MatchingLabels{LabelPool: "pool"})); n != 1 {
		t.Fatalf("%d pool Sandboxes, want 1 (nothing taken)", n)
	}
}

// TestTwoClaimsRacingForOneSandbox makes claim b take the first candidate
// between claim a's read and its Update: a's Update conflicts, and a
// takes the other one.
func TestTwoClaimsRacingForOneSandbox(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 2)
	e.fillPool("pool")
	e.createClaim("a", "py")
	e.createClaim("b", "py")

	var conflicts atomic.Int32
	var once sync.Once
	racing := interceptor.NewClient(e.client.(client.WithWatch), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*v1.Sandbox); ok {
				once.Do(func() { e.reconcileClaim("b") }) // b gets there first
			}
			err := c.Update(ctx, obj, opts...)
			if apierrors.IsConflict(err) {
				conflicts.Add(1)
			}
			return err
		},
	})
	a := &ClaimReconciler{Client: racing, Scheme: e.claims.Scheme, Log: e.claims.Log}
	if _, err := a.Reconcile(e.ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	if conflicts.Load() == 0 {
		t.Fatal("claim a's take did not conflict: the race was not staged")
	}
	ca, cb := e.getClaim("a"), e.getClaim("b")
	if ca.Status.Sandbox.Name == "" || ca.Status.Sandbox.Name == cb.Status.Sandbox.Name {
		t.Fatalf("claims bound to %q and %q, want two different Sandboxes", ca.Status.Sandbox.Name, cb.Status.Sandbox.Name)
	}
	for _, c := range []*v1.SandboxClaim{ca, cb} {
		wantCondition(t, c.Status.Conditions, ConditionWarmPool, metav1.ConditionTrue, ReasonTakenFromPool)
		if sb := e.get(c.Status.Sandbox.Name); !metav1.IsControlledBy(sb, c) {
			t.Fatalf("Sandbox %s is not controlled by claim %s: %+v", sb.Name, c.Name, sb.OwnerReferences)
		}
	}
}

// TestManyClaimsRacingForAPool reconciles 8 claims at once against a
// pool of 6: every Sandbox ends up with one controller, 6 claims take
// one each, 2 fork.
func TestManyClaimsRacingForAPool(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 16 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 6)
	e.fillPool("pool")
	const claims = 8
	for i := range claims {
		e.createClaim(fmt.Sprintf("c%d", i), "py")
	}
	var wg sync.WaitGroup
	errs := make(chan error, claims)
	for i := range claims {
		wg.Go(func() {
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("c%d", i)}}
			if _, err := e.claims.Reconcile(e.ctx, req); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range claims { // the requeues: the forked claims' status
		e.reconcileClaim(fmt.Sprintf("c%d", i))
	}

	bound := map[string]string{}
	taken := 0
	for i := range claims {
		c := e.getClaim(fmt.Sprintf("c%d", i))
		if other, dup := bound[c.Status.Sandbox.Name]; dup || c.Status.Sandbox.Name == "" {
			t.Fatalf("claim %s bound to %q, as is %q", c.Name, c.Status.Sandbox.Name, other)
		}
		bound[c.Status.Sandbox.Name] = c.Name
		if meta.IsStatusConditionTrue(c.Status.Conditions, ConditionWarmPool) {
			taken++
		}
	}
	if taken != 6 {
		t.Fatalf("%d claims took from the pool, want 6", taken)
	}
	for _, sb := range e.sandboxes(nil) {
		controllers := 0
		for _, ref := range sb.OwnerReferences {
			if ref.Controller != nil && *ref.Controller {
				controllers++
			}
		}
		if controllers != 1 {
			t.Fatalf("Sandbox %s has %d controllers: %+v", sb.Name, controllers, sb.OwnerReferences)
		}
		if owner := metav1.GetControllerOf(&sb); owner.Kind == "SandboxClaim" && bound[sb.Name] != owner.Name {
			t.Fatalf("Sandbox %s controlled by claim %s, bound to %q", sb.Name, owner.Name, bound[sb.Name])
		}
	}
}

func TestDeletingAPoolSparesTakenSandboxes(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 2)
	e.fillPool("pool")
	e.createClaim("c", "py")
	e.reconcileClaim("c")
	kept := e.getClaim("c").Status.Sandbox.Name
	e.reconcilePool("pool") // forks a replacement

	if err := e.client.Delete(e.ctx, e.getPool("pool")); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool("pool") // gone: its unclaimed Sandboxes go too
	e.reconcileSandboxes()  // their finalizers
	left := e.sandboxes(nil)
	if len(left) != 1 || left[0].Name != kept {
		t.Fatalf("Sandboxes left %v, want only the claim's %s", left, kept)
	}
	if owner := metav1.GetControllerOf(&left[0]); owner == nil || owner.Kind != "SandboxClaim" || len(left[0].OwnerReferences) != 1 {
		t.Fatalf("taken Sandbox owners %+v: the garbage collector would take it with the pool", left[0].OwnerReferences)
	}
	if left[0].Status.Phase != v1.SandboxRunning {
		t.Fatalf("taken Sandbox is %s", left[0].Status.Phase)
	}
	if _, _, dels := e.standIn["n1"].counts(); len(dels) != 1 {
		t.Fatalf("DELETEs on the node %v, want the one forked unclaimed Sandbox", dels)
	}
}
