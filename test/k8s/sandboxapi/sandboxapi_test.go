// Package sandboxapi_test installs forkd's CRDs (k8s/config/crd) into a
// real kube-apiserver and drives the objects through the typed client.
package sandboxapi_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	forkdv1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/test/k8s/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// crdDir is k8s/config/crd, relative to this package's directory (go test
// runs a test in its package's directory).
var crdDir = filepath.Join("..", "..", "..", "k8s", "config", "crd")

// TestSandboxClaimRoundTrip installs the four CRDs, creates a template and
// a claim for it, binds the claim the way the controller will (status
// subresource) and reads everything back; the schema's validation, its
// defaults and the warm pool's scale subresource are checked on the way.
func TestSandboxClaimRoundTrip(t *testing.T) {
	_, cfg := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	began := time.Now()
	crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{crdDir}, ErrorIfPathMissing: true, MaxTime: 2 * time.Minute,
	})
	if err != nil {
		t.Fatalf("install the CRDs from %s: %v", crdDir, err)
	}
	if len(crds) != 4 {
		t.Fatalf("installed %d CRDs from %s, want 4 (Sandbox, SandboxTemplate, SandboxClaim, SandboxWarmPool)", len(crds), crdDir)
	}
	t.Logf("4 CRDs established in %v", time.Since(began).Round(time.Millisecond))

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, forkdv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := "agents"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}

	tmpl := &forkdv1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "py-pandas"},
		Spec: forkdv1.SandboxTemplateSpec{SandboxBlueprint: forkdv1.SandboxBlueprint{
			Snapshot: forkdv1.SnapshotRef{Tag: "py-pandas", Image: "registry.example/forkd/py-pandas:1"},
			Network:  &forkdv1.NetworkPolicy{Mode: forkdv1.NetworkAllow, Allow: []string{"198.51.100.0/24:443/tcp"}},
		}},
	}
	if err := c.Create(ctx, tmpl); err != nil {
		t.Fatalf("create template: %v", err)
	}
	// The schema is enforced: a tag forkd would refuse is refused here.
	bad := tmpl.DeepCopy()
	bad.ResourceVersion, bad.Name, bad.Spec.Snapshot.Tag = "", "bad", "Py Pandas"
	if err := c.Create(ctx, bad); !apierrors.IsInvalid(err) {
		t.Fatalf("a template with tag %q: got %v, want Invalid", bad.Spec.Snapshot.Tag, err)
	}
	badNet := tmpl.DeepCopy()
	badNet.ResourceVersion, badNet.Name, badNet.Spec.Network.Mode = "", "bad-net", "open"
	if err := c.Create(ctx, badNet); !apierrors.IsInvalid(err) {
		t.Fatalf("a template with network mode %q: got %v, want Invalid", badNet.Spec.Network.Mode, err)
	}

	timeout := int64(600)
	claim := &forkdv1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent-1", Labels: map[string]string{"team": "a"}},
		Spec: forkdv1.SandboxClaimSpec{
			TemplateRef: forkdv1.LocalRef{Name: tmpl.Name},
			Lifecycle:   &forkdv1.Lifecycle{TimeoutSeconds: &timeout},
		},
	}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatalf("create claim: %v", err)
	}
	// The apiserver applied the schema's default.
	if claim.Spec.Lifecycle.ShutdownPolicy != forkdv1.ShutdownPolicyRetain {
		t.Fatalf("claim created with shutdownPolicy %q, want the default %q", claim.Spec.Lifecycle.ShutdownPolicy, forkdv1.ShutdownPolicyRetain)
	}

	// Bind it as the controller will: through the status subresource.
	claim.Status.Sandbox = forkdv1.ClaimedSandbox{Name: "agent-1-x7k2", NodeName: "node-a", SandboxID: "sb-0123456789ab",
		Endpoint: "http://198.51.100.10:7070/v1/sandboxes/sb-0123456789ab"}
	meta.SetStatusCondition(&claim.Status.Conditions, metav1.Condition{
		Type: forkdv1.ConditionReady, Status: metav1.ConditionTrue, Reason: forkdv1.ReasonForked, Message: "forked in 41 ms",
	})
	if err := c.Status().Update(ctx, claim); err != nil {
		t.Fatalf("update claim status: %v", err)
	}
	// A spec change through the main resource leaves the status alone.
	claim.Spec.Lifecycle.IdleTimeoutSeconds = &timeout
	if err := c.Update(ctx, claim); err != nil {
		t.Fatalf("update claim: %v", err)
	}

	var list forkdv1.SandboxClaimList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{"team": "a"}); err != nil {
		t.Fatalf("list claims: %v", err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("listed %d claims with team=a, want 1", len(list.Items))
	}
	got := list.Items[0]
	if got.Spec.TemplateRef.Name != tmpl.Name || got.Status.Sandbox != claim.Status.Sandbox ||
		got.Spec.Lifecycle.IdleTimeoutSeconds == nil || *got.Spec.Lifecycle.IdleTimeoutSeconds != timeout {
		t.Fatalf("claim read back as spec %+v status %+v", got.Spec, got.Status)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, forkdv1.ConditionReady) {
		t.Fatalf("claim read back without Ready=True: %+v", got.Status.Conditions)
	}

	// A warm pool scales through the scale subresource, as an HPA or
	// `kubectl scale` would.
	pool := &forkdv1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "py-pool"},
		Spec:       forkdv1.SandboxWarmPoolSpec{Replicas: 2, TemplateRef: forkdv1.LocalRef{Name: tmpl.Name}},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create warm pool: %v", err)
	}
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 5}}
	if err := c.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("scale the warm pool: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	if pool.Spec.Replicas != 5 {
		t.Fatalf("warm pool has %d replicas after scaling to 5", pool.Spec.Replicas)
	}

	// A Sandbox, the object a claim binds to, takes its blueprint and a
	// phase from the schema's enum.
	sb := &forkdv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent-1-x7k2"},
		Spec:       forkdv1.SandboxSpec{SandboxBlueprint: tmpl.Spec.SandboxBlueprint},
	}
	if err := c.Create(ctx, sb); err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	sb.Status.Phase = "Exploded"
	if err := c.Status().Update(ctx, sb); !apierrors.IsInvalid(err) {
		t.Fatalf("sandbox status phase %q: got %v, want Invalid", sb.Status.Phase, err)
	}
}
