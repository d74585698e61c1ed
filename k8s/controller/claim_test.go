package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// reconcileClaim reconciles a claim as its manager would: when its first
// status waits for a new Sandbox's news (claim_first.go), the clock
// passes the wait and it is reconciled again, so the claim's status is
// written either way.
func (e *testEnv) reconcileClaim(name string) {
	e.t.Helper()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}
	res, err := e.claims.Reconcile(e.ctx, req)
	if err == nil && res.RequeueAfter > 0 && res.RequeueAfter <= firstStatusWait && e.getClaim(name).Status.Sandbox.Name == "" {
		e.now = e.now.Add(res.RequeueAfter)
		_, err = e.claims.Reconcile(e.ctx, req)
	}
	if err != nil {
		e.t.Fatalf("reconcile claim %s: %v", name, err)
	}
}

func (e *testEnv) getClaim(name string) *v1.SandboxClaim {
	e.t.Helper()
	var c v1.SandboxClaim
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, &c); err != nil {
		e.t.Fatal(err)
	}
	return &c
}

func TestClaimBindsAForkedSandbox(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	timeout := int64(300)
	e.create(&v1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "py", Namespace: "default"},
		Spec: v1.SandboxTemplateSpec{
			SandboxBlueprint: v1.SandboxBlueprint{Snapshot: v1.SnapshotRef{Tag: "py"}},
			Lifecycle:        &v1.Lifecycle{TimeoutSeconds: &timeout},
		},
	})
	e.create(&v1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "job-1", Namespace: "default", UID: "uid-claim"},
		Spec:       v1.SandboxClaimSpec{TemplateRef: v1.LocalRef{Name: "py"}},
	})

	e.reconcileClaim("job-1")
	sb := e.get("job-1")
	if !metav1.IsControlledBy(sb, e.getClaim("job-1")) {
		t.Fatalf("Sandbox owners %+v: not controlled by the claim", sb.OwnerReferences)
	}
	if sb.Spec.Snapshot.Tag != "py" || sb.Spec.Lifecycle == nil || *sb.Spec.Lifecycle.TimeoutSeconds != 300 {
		t.Fatalf("Sandbox spec %+v: want the template's blueprint and lifecycle", sb.Spec)
	}
	if sb.Labels[LabelClaim] != "job-1" || sb.Labels[LabelTemplate] != "py" {
		t.Fatalf("labels %v", sb.Labels)
	}
	c := e.getClaim("job-1")
	wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, "SandboxNotReady")

	// The Sandbox is forked; the claim (woken by its owned Sandbox in a
	// real manager) copies where it runs.
	e.reconcile("job-1")
	e.reconcileClaim("job-1")
	c = e.getClaim("job-1")
	got := e.get("job-1").Status
	want := v1.ClaimedSandbox{Name: "job-1", NodeName: "n1", SandboxID: got.SandboxID, Endpoint: got.Endpoint}
	if got.SandboxID == "" || c.Status.Sandbox != want {
		t.Fatalf("claim status.sandbox %+v, want %+v", c.Status.Sandbox, want)
	}
	wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked)

	// Reconciling again creates nothing more.
	e.reconcileClaim("job-1")
	e.reconcile("job-1")
	if f, created, _ := e.standIn["n1"].counts(); f != 1 || created != 1 {
		t.Fatalf("%d fork calls, %d created; want 1, 1", f, created)
	}
}

func TestClaimLifecycleOverridesTemplate(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	tmplTimeout, claimTimeout := int64(300), int64(30)
	e.create(&v1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "py", Namespace: "default"},
		Spec: v1.SandboxTemplateSpec{
			SandboxBlueprint: v1.SandboxBlueprint{Snapshot: v1.SnapshotRef{Tag: "py"}},
			Lifecycle:        &v1.Lifecycle{TimeoutSeconds: &tmplTimeout},
		},
	})
	e.create(&v1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
		Spec: v1.SandboxClaimSpec{TemplateRef: v1.LocalRef{Name: "py"}, WarmPoolRef: &v1.LocalRef{Name: "pool"},
			Lifecycle: &v1.Lifecycle{TimeoutSeconds: &claimTimeout}},
	})
	e.reconcileClaim("c")
	if got := *e.get("c").Spec.Lifecycle.TimeoutSeconds; got != 30 {
		t.Fatalf("timeout %d, want the claim's 30", got)
	}
	wantCondition(t, e.getClaim("c").Status.Conditions, ConditionWarmPool, metav1.ConditionFalse, ReasonPoolNotFound)
}

func TestClaimMissingTemplate(t *testing.T) {
	e := newTestEnv(t)
	e.create(&v1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
		Spec:       v1.SandboxClaimSpec{TemplateRef: v1.LocalRef{Name: "absent"}},
	})
	e.reconcileClaim("c")
	wantCondition(t, e.getClaim("c").Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonTemplateNotFound)
}
