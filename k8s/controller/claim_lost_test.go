package controller

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// lostClaimEnv is two nodes holding py (n1 first on a tie) and claim c
// Running on n1, then n1 lost: c's Sandbox is Lost.
func lostClaimEnv(t *testing.T, policy v1.LostPolicy) *testEnv {
	t.Helper()
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.createTemplate("py", "py")
	e.createClaim("c", "py", func(c *v1.SandboxClaim) { c.Spec.LostPolicy = policy })
	e.reconcileClaim("c")
	e.reconcile("c")
	e.reconcileClaim("c")
	if c := e.getClaim("c"); c.Status.Sandbox.NodeName != "n1" {
		t.Fatalf("claim on %q, want n1", c.Status.Sandbox.NodeName)
	}
	e.standIn["n1"].setDown(true)
	e.poll()
	e.poll() // threshold 2: n1 lost
	if p := e.get("c").Status.Phase; p != v1.SandboxLost {
		t.Fatalf("phase %s, want Lost", p)
	}
	return e
}

func TestLostSandboxReplacedOnAnotherNode(t *testing.T) {
	for _, policy := range []v1.LostPolicy{"", v1.LostPolicyReplace} { // "" is the default
		t.Run("policy="+string(policy), func(t *testing.T) {
			e := lostClaimEnv(t, policy)
			e.reconcileClaim("c")
			c := e.getClaim("c")
			if c.Status.Sandbox.Name != "c-r1" || c.Status.Replacements != 1 {
				t.Fatalf("status %+v, want Sandbox c-r1 and 1 replacement", c.Status)
			}
			wantCondition(t, c.Status.Conditions, ConditionReplacing, metav1.ConditionFalse, ReasonReplaced)
			wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonReplacing)
			if sb := e.get("c-r1"); !metav1.IsControlledBy(sb, c) || sb.Labels[LabelClaim] != "c" {
				t.Fatalf("replacement owners %+v labels %v", sb.OwnerReferences, sb.Labels)
			}

			// The lost one goes without asking its dead node; the new one
			// forks on n2.
			e.reconcile("c")
			var gone v1.Sandbox
			if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: "c"}, &gone); !apierrors.IsNotFound(err) {
				t.Fatalf("lost Sandbox still there: %v (finalizers %v)", err, gone.Finalizers)
			}
			e.reconcile("c-r1")
			e.reconcileClaim("c")
			c = e.getClaim("c")
			wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked)
			if c.Status.Sandbox.NodeName != "n2" || c.Status.Sandbox.SandboxID == "" {
				t.Fatalf("claim status.sandbox %+v, want running on n2", c.Status.Sandbox)
			}
			if f, _, dels := e.standIn["n1"].counts(); f != 1 || len(dels) != 0 {
				t.Fatalf("lost node n1: %d forks, DELETEs %v; want 1 and none", f, dels)
			}
			if f, _, _ := e.standIn["n2"].counts(); f != 1 {
				t.Fatalf("n2: %d forks, want 1", f)
			}

			// Reconciling again replaces nothing more.
			e.reconcileClaim("c")
			if c := e.getClaim("c"); c.Status.Replacements != 1 || len(e.sandboxes(nil)) != 1 {
				t.Fatalf("replacements %d, %d Sandboxes; want 1, 1", c.Status.Replacements, len(e.sandboxes(nil)))
			}
		})
	}
}

// TestReplacementResumesAfterAFailedCreate: the status naming c-r1 was
// written, its creation was not (the template vanished meanwhile); the
// next reconcile, the template back, creates it, and counts no second
// replacement.
func TestReplacementResumesAfterAFailedCreate(t *testing.T) {
	e := lostClaimEnv(t, v1.LostPolicyReplace)
	var tmpl v1.SandboxTemplate
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: "py"}, &tmpl); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Delete(e.ctx, &tmpl); err != nil {
		t.Fatal(err)
	}
	e.reconcileClaim("c")
	c := e.getClaim("c")
	wantCondition(t, c.Status.Conditions, ConditionReplacing, metav1.ConditionTrue, v1.ReasonNodeLost)
	wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonTemplateNotFound)

	e.createTemplate("py", "py")
	e.reconcileClaim("c")
	c = e.getClaim("c")
	if c.Status.Sandbox.Name != "c-r1" || c.Status.Replacements != 1 {
		t.Fatalf("status %+v, want c-r1 and 1 replacement", c.Status)
	}
	wantCondition(t, c.Status.Conditions, ConditionReplacing, metav1.ConditionFalse, ReasonReplaced)
	e.get("c-r1")
}

func TestLostSandboxFailsTheClaim(t *testing.T) {
	e := lostClaimEnv(t, v1.LostPolicyFail)
	e.reconcileClaim("c")
	e.reconcileClaim("c")
	c := e.getClaim("c")
	wantCondition(t, c.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, ReasonSandboxLost)
	if c.Status.Sandbox.Name != "c" || c.Status.Replacements != 0 || len(e.sandboxes(nil)) != 1 {
		t.Fatalf("status %+v with %d Sandboxes; want the lost one kept, no replacement", c.Status, len(e.sandboxes(nil)))
	}
	if f, _, _ := e.standIn["n2"].counts(); f != 0 {
		t.Fatalf("n2 got %d forks under lostPolicy Fail", f)
	}
}

func TestReplacementName(t *testing.T) {
	long := strings.Repeat("a", 249) + ".bb" // 252 characters
	for _, tc := range []struct {
		claim string
		n     int32
		want  string
	}{
		{"job", 1, "job-r1"},
		{"job", 12, "job-r12"},
		{long, 3, strings.Repeat("a", 249) + "-r3"}, // cut to 250, the "." trimmed
	} {
		if got := replacementName(tc.claim, tc.n); got != tc.want || len(got) > 253 {
			t.Errorf("replacementName(%d chars, %d) = %q (%d chars), want %q", len(tc.claim), tc.n, got, len(got), tc.want)
		}
	}
}
