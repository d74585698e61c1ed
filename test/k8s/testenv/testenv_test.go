package testenv_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/forkd-dev/forkd/test/k8s/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var probeGVK = schema.GroupVersionKind{Group: "smoke.forkd.dev", Version: "v1alpha1", Kind: "Probe"}

// probeCRD is a namespaced resource with a spec, a status subresource and a
// printer column: the shapes the forkd CRDs will use.
func probeCRD() *apiextensionsv1.CustomResourceDefinition {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "probes." + probeGVK.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: probeGVK.Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: "probes", Singular: "probe", Kind: probeGVK.Kind, ListKind: probeGVK.Kind + "List",
			},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: probeGVK.Version, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Node", Type: "string", JSONPath: ".status.node"},
				},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Required: []string{"snapshot"},
							Properties: map[string]apiextensionsv1.JSONSchemaProps{"snapshot": str}},
						"status": {Type: "object",
							Properties: map[string]apiextensionsv1.JSONSchemaProps{"node": str}},
					},
				}},
			}},
		},
	}
}

// TestControlPlane starts etcd and kube-apiserver, installs a CRD and drives
// core and custom objects through the controller-runtime client.
func TestControlPlane(t *testing.T) {
	env, cfg := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ver, err := dc.ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if ver.Major == "" || ver.Minor == "" {
		t.Fatalf("server version %+v has no major/minor: built without the version ldflags?", ver)
	}
	t.Logf("kube-apiserver %s", ver.GitVersion)

	began := time.Now()
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		CRDs: []*apiextensionsv1.CustomResourceDefinition{probeCRD()}, MaxTime: 2 * time.Minute,
	}); err != nil {
		t.Fatalf("install CRD: %v", err)
	}
	t.Logf("CRD established in %v", time.Since(began).Round(time.Millisecond))

	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "cfg"},
		Data:       map[string]string{"k": "v"},
	}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatalf("create configmap: %v", err)
	}
	var gotCM corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &gotCM); err != nil {
		t.Fatalf("get configmap: %v", err)
	}
	if gotCM.Data["k"] != "v" || gotCM.UID == "" {
		t.Fatalf("configmap read back as %+v", gotCM)
	}

	probe := &unstructured.Unstructured{}
	probe.SetGroupVersionKind(probeGVK)
	probe.SetNamespace(ns.Name)
	probe.SetName("p1")
	probe.SetLabels(map[string]string{"pool": "warm"})
	if err := unstructured.SetNestedField(probe.Object, "py-pandas", "spec", "snapshot"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, probe); err != nil {
		t.Fatalf("create probe: %v", err)
	}

	// The schema is enforced: a probe without spec.snapshot is refused.
	bad := &unstructured.Unstructured{}
	bad.SetGroupVersionKind(probeGVK)
	bad.SetNamespace(ns.Name)
	bad.SetName("bad")
	bad.Object["spec"] = map[string]any{}
	if err := c.Create(ctx, bad); err == nil {
		t.Fatal("a probe without spec.snapshot was accepted: the CRD schema is not enforced")
	}

	// Status goes through the subresource and survives a read back.
	if err := unstructured.SetNestedField(probe.Object, "node-a", "status", "node"); err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Update(ctx, probe); err != nil {
		t.Fatalf("update probe status: %v", err)
	}
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(probeGVK.GroupVersion().WithKind(probeGVK.Kind + "List"))
	if err := c.List(ctx, &list, client.InNamespace(ns.Name), client.MatchingLabels{"pool": "warm"}); err != nil {
		t.Fatalf("list probes: %v", err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("listed %d probes with pool=warm, want 1", len(list.Items))
	}
	node, _, _ := unstructured.NestedString(list.Items[0].Object, "status", "node")
	snap, _, _ := unstructured.NestedString(list.Items[0].Object, "spec", "snapshot")
	if node != "node-a" || snap != "py-pandas" {
		t.Fatalf("probe read back with status.node=%q spec.snapshot=%q", node, snap)
	}
}
