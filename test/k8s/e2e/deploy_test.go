package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// deployment is what installDeploy read from the manifests that the test
// needs to play the kubelet and run the controller as deployed.
type deployment struct {
	namespace  string            // the DaemonSet's
	podLabels  map[string]string // its pod template's
	selector   labels.Selector   // the controller's --daemon-selector
	port       string            // --daemon-port
	serverName string            // --server-name
}

// installDeploy installs deploy/manifests/crds and creates every object of
// deploy/manifests/*.yaml, decoded strictly with the real scheme. Nothing
// runs them (no kubelet): the apiserver accepting them is the check.
func installDeploy(ctx context.Context, t *testing.T, cfg *rest.Config, c client.Client, scheme *runtime.Scheme, dir string) deployment {
	t.Helper()
	began := time.Now()
	crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(dir, "crds")}, ErrorIfPathMissing: true, MaxTime: 2 * time.Minute,
	})
	if err != nil {
		t.Fatalf("install the CRDs of %s/crds: %v", dir, err)
	}
	if len(crds) != 4 {
		t.Fatalf("installed %d CRDs from %s/crds, want 4", len(crds), dir)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	sort.Strings(files) // 00-namespace first
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	var dep deployment
	var kinds []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if blank(doc) {
				continue
			}
			obj, gvk, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: decode: %v", f, err)
			}
			co, ok := obj.(client.Object)
			if !ok {
				t.Fatalf("%s: %s is not an object", f, gvk)
			}
			if err := c.Create(ctx, co); err != nil {
				t.Fatalf("%s: create %s %s: %v", filepath.Base(f), gvk.Kind, co.GetName(), err)
			}
			kinds = append(kinds, gvk.Kind+"/"+co.GetName())
			switch o := obj.(type) {
			case *appsv1.DaemonSet:
				dep.namespace, dep.podLabels = o.Namespace, o.Spec.Template.Labels
			case *appsv1.Deployment:
				args := map[string]string{}
				for _, a := range o.Spec.Template.Spec.Containers[0].Args {
					if k, v, ok := strings.Cut(a, "="); ok {
						args[k] = v
					}
				}
				if dep.selector, err = labels.Parse(args["--daemon-selector"]); err != nil {
					t.Fatalf("%s: --daemon-selector: %v", f, err)
				}
				dep.port, dep.serverName = args["--daemon-port"], args["--server-name"]
			}
		}
	}
	if dep.podLabels == nil || dep.selector == nil || !dep.selector.Matches(labels.Set(dep.podLabels)) {
		t.Fatalf("the controller's --daemon-selector %v does not match the DaemonSet's pods %v", dep.selector, dep.podLabels)
	}
	if dep.port != "7070" || dep.serverName != serverName {
		t.Fatalf("the controller's --daemon-port %q, --server-name %q: this test's daemons listen on 7070 for %s", dep.port, dep.serverName, serverName)
	}
	t.Logf("deploy/manifests installed in %v: 4 CRDs, %s", time.Since(began).Round(time.Millisecond), strings.Join(kinds, ", "))
	return dep
}
