package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// setTemplateTag changes a template's snapshot tag, as its author would.
func (e *testEnv) setTemplateTag(name, tag string) *v1.SandboxTemplate {
	e.t.Helper()
	var tmpl v1.SandboxTemplate
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, &tmpl); err != nil {
		e.t.Fatal(err)
	}
	tmpl.Spec.Snapshot.Tag = tag
	if err := e.client.Update(e.ctx, &tmpl); err != nil {
		e.t.Fatal(err)
	}
	return &tmpl
}

// poolSplit counts a pool's live Sandboxes forked from snapshot tag and
// from any other, and checks each carries the hash its spec came from.
func (e *testEnv) poolSplit(pool, tag string) (current, outdated int) {
	e.t.Helper()
	for _, sb := range e.sandboxes(client.MatchingLabels{LabelPool: pool}) {
		if !sb.DeletionTimestamp.IsZero() {
			continue
		}
		if sb.Labels[LabelTemplateHash] == "" {
			e.t.Fatalf("pool Sandbox %s has no %s label", sb.Name, LabelTemplateHash)
		}
		if sb.Spec.Snapshot.Tag == tag {
			current++
		} else {
			outdated++
		}
	}
	return current, outdated
}

// TestWarmPoolRollsOutAChangedTemplate: a template changed under a full
// pool is rolled out as a Deployment rolls out a pod template: new
// Sandboxes fork first, the old ones go only as new ones run (so the
// pool keeps serving claims), claims take new ones first, and the pool
// reports updatedReplicas and its Ready condition throughout.
func TestWarmPoolRollsOutAChangedTemplate(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 16 * gib, snapshots: map[string]int{"py": 512, "py2": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 2)
	e.fillPool("pool")
	p := e.getPool("pool")
	h1 := p.Status.TemplateHash
	if h1 == "" || p.Status.UpdatedReplicas != 2 {
		t.Fatalf("full pool status %+v: want templateHash set, updatedReplicas 2", p.Status)
	}
	wantCondition(t, p.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, ReasonPoolReady)

	tmpl := e.setTemplateTag("py", "py2")
	if reqs := e.pools.poolsOfTemplate(e.ctx, tmpl); len(reqs) != 1 || reqs[0].Name != "pool" {
		t.Fatalf("the template's change wakes %v, want the pool", reqs)
	}

	// New ones fork; the old ones, Running, stay.
	e.reconcilePool("pool")
	if cur, old := e.poolSplit("pool", "py2"); cur != 2 || old != 2 {
		t.Fatalf("after the change: %d new, %d old Sandboxes; want 2 and 2", cur, old)
	}
	p = e.getPool("pool")
	if p.Status.TemplateHash == h1 || p.Status.UpdatedReplicas != 2 || p.Status.Replicas != 4 {
		t.Fatalf("rolling out, status %+v: want a new hash, updatedReplicas 2 of 4", p.Status)
	}
	wantCondition(t, p.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonRollingOut)

	// Once the new ones run, a claim takes a new one.
	e.reconcileSandboxes()
	e.createClaim("c1", "py")
	e.reconcileClaim("c1")
	if sb := e.get(e.getClaim("c1").Status.Sandbox.Name); sb.Spec.Snapshot.Tag != "py2" {
		t.Fatalf("the claim took a Sandbox of %q, want one of the template as it is now (py2)", sb.Spec.Snapshot.Tag)
	}

	// The pool refills with a new one and lets one old one go (3
	// Running of want 2); then, the refill Running, the other.
	e.reconcilePool("pool")
	if cur, old := e.poolSplit("pool", "py2"); cur != 2 || old != 1 {
		t.Fatalf("after the claim: %d new, %d old; want 2 and 1", cur, old)
	}
	e.reconcileSandboxes()
	e.reconcilePool("pool")
	e.reconcileSandboxes()
	e.reconcilePool("pool")
	if cur, old := e.poolSplit("pool", "py2"); cur != 2 || old != 0 {
		t.Fatalf("rolled out: %d new, %d old; want 2 and 0", cur, old)
	}
	p = e.getPool("pool")
	if p.Status.Replicas != 2 || p.Status.ReadyReplicas != 2 || p.Status.UpdatedReplicas != 2 {
		t.Fatalf("rolled out, status %+v", p.Status)
	}
	wantCondition(t, p.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, ReasonPoolReady)
	if f, _, _ := e.standIn["n1"].counts(); f != 5 {
		t.Fatalf("%d forks, want 5 (2 first, 2 for the change, 1 after the claim)", f)
	}
}

// TestWarmPoolTemplateMissing: a pool whose template is gone says so in
// its Ready condition and keeps its Sandboxes (claims may still take them).
func TestWarmPoolTemplateMissing(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 1)
	e.fillPool("pool")
	if err := e.client.Delete(e.ctx, &v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "py"}}); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool("pool")
	p := e.getPool("pool")
	wantCondition(t, p.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonTemplateNotFound)
	if cur, _ := e.poolSplit("pool", "py"); cur != 1 || p.Status.Replicas != 1 {
		t.Fatalf("%d Sandboxes left, status %+v; want the one kept", cur, p.Status)
	}
}

// TestWarmPoolRolloutOnAFullNode: with no room for the new Sandboxes, the
// pool lets one old Running Sandbox go at a time (a maxUnavailable of 1)
// rather than wait for ever.
func TestWarmPoolRolloutOnAFullNode(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 1 * gib, snapshots: map[string]int{"py": 512, "py2": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 2)
	e.fillPool("pool")
	e.setTemplateTag("py", "py2")
	// Each round is what the manager does on the events: the pool, then
	// every Sandbox (the order of the list varies: run to completion).
	for range 12 {
		e.reconcilePool("pool")
		e.reconcileSandboxes()
		e.reconcilePool("pool")
		if cur, old := e.poolSplit("pool", "py2"); cur == 2 && old == 0 && e.getPool("pool").Status.ReadyReplicas == 2 {
			break
		}
	}
	p := e.getPool("pool")
	if cur, old := e.poolSplit("pool", "py2"); cur != 2 || old != 0 || p.Status.ReadyReplicas != 2 {
		t.Fatalf("on a full node: %d new, %d old, status %+v; want the rollout done", cur, old, p.Status)
	}
	wantCondition(t, p.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, ReasonPoolReady)
}

// TestWarmPoolAdoptsUnhashedSandboxes: Sandboxes a pool forked before
// pools hashed their template are taken as current and labelled, not
// rolled out (which would fork the whole pool again on an upgrade).
func TestWarmPoolAdoptsUnhashedSandboxes(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createPool("pool", "py", 2)
	e.fillPool("pool")
	// As an older controller left them.
	for _, sb := range e.sandboxes(client.MatchingLabels{LabelPool: "pool"}) {
		delete(sb.Labels, LabelTemplateHash)
		if err := e.client.Update(e.ctx, &sb); err != nil {
			t.Fatal(err)
		}
	}
	p := e.getPool("pool")
	p.Status = v1.SandboxWarmPoolStatus{Replicas: 2, ReadyReplicas: 2}
	if err := e.client.Status().Update(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	e.reconcilePool("pool")
	hash := e.getPool("pool").Status.TemplateHash
	for _, sb := range e.sandboxes(client.MatchingLabels{LabelPool: "pool"}) {
		if sb.Labels[LabelTemplateHash] != hash || !sb.DeletionTimestamp.IsZero() {
			t.Fatalf("Sandbox %s: labels %v, deleting %v; want kept and labelled %s", sb.Name, sb.Labels, !sb.DeletionTimestamp.IsZero(), hash)
		}
	}
	if f, _, _ := e.standIn["n1"].counts(); f != 2 {
		t.Fatalf("%d forks, want the first 2 only", f)
	}
}
