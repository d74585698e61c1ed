// Package deploytest checks deploy/: every plain manifest decodes, with no
// unknown field, into the typed object of its kind; the CRD copies match
// k8s/config/crd; and the Helm chart, rendered with its default values,
// gives the same objects as the plain manifests. No helm binary is needed:
// the chart's templates use only .Values, .Release.Namespace, with, quote,
// toYaml and nindent, which render() provides.
package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

const root = "../.."

// docs splits a YAML stream into its non-empty documents.
func docs(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// typed returns an empty object of the manifest's kind.
func typed(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apiextensions.k8s.io/v1/CustomResourceDefinition":
		return &apiextv1.CustomResourceDefinition{}, nil
	}
	return nil, fmt.Errorf("no typed object for %s %s: add it to typed() if it belongs in deploy/", apiVersion, kind)
}

type object struct {
	file string
	kind string
	name string
	obj  any            // typed
	raw  map[string]any // as written
}

// decode decodes every document strictly into its typed object.
func decode(t *testing.T, file string, data []byte) []object {
	t.Helper()
	var out []object
	for i, d := range docs(t, data) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(d, &head); err != nil {
			t.Fatalf("%s document %d: %v", file, i, err)
		}
		obj, err := typed(head.APIVersion, head.Kind)
		if err != nil {
			t.Fatalf("%s document %d: %v", file, i, err)
		}
		if err := yaml.UnmarshalStrict(d, obj); err != nil {
			t.Fatalf("%s document %d (%s %s): %v", file, i, head.Kind, head.Metadata.Name, err)
		}
		var raw map[string]any
		if err := yaml.Unmarshal(d, &raw); err != nil {
			t.Fatal(err)
		}
		out = append(out, object{file: file, kind: head.Kind, name: head.Metadata.Name, obj: obj, raw: raw})
	}
	return out
}

func plainObjects(t *testing.T) []object {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "deploy/manifests/*.yaml"))
	crds, _ := filepath.Glob(filepath.Join(root, "deploy/manifests/crds/*.yaml"))
	files = append(files, crds...)
	if len(files) < 8 {
		t.Fatalf("found %d manifest files under deploy/manifests: %v", len(files), files)
	}
	var out []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decode(t, f, data)...)
	}
	return out
}

func TestPlainManifestsDecode(t *testing.T) {
	objs := plainObjects(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.kind]++
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "DaemonSet", "CustomResourceDefinition", "Service"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in deploy/manifests", k)
		}
	}
	if kinds["CustomResourceDefinition"] != 4 {
		t.Errorf("%d CRDs, want forkd's 4", kinds["CustomResourceDefinition"])
	}
	sas := map[string]bool{}
	for _, o := range objs {
		if sa, ok := o.obj.(*corev1.ServiceAccount); ok {
			sas[sa.Namespace+"/"+sa.Name] = true
		}
	}
	for _, o := range objs {
		if svc, ok := o.obj.(*corev1.Service); ok {
			checkService(t, o, svc, objs)
		}
		switch x := o.obj.(type) {
		case *appsv1.DaemonSet:
			checkSelector(t, o, x.Spec.Selector.MatchLabels, x.Spec.Template.Labels)
			checkSA(t, o, sas, x.Namespace, x.Spec.Template.Spec.ServiceAccountName)
			ps := x.Spec.Template.Spec
			if !ps.HostPID {
				t.Errorf("%s: DaemonSet %s without hostPID", o.file, x.Name)
			}
			c := ps.Containers[0]
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Errorf("%s: the daemon is not privileged", o.file)
			}
			if len(c.Args) == 0 || c.Args[0] != "serve" {
				t.Errorf("%s: the daemon's args %v do not start with serve", o.file, c.Args)
			}
			hostData := false
			for _, v := range ps.Volumes {
				hostData = hostData || v.HostPath != nil && v.HostPath.Path == "/var/lib/forkd"
			}
			if !hostData {
				t.Errorf("%s: no hostPath for the data directory", o.file)
			}
		case *appsv1.Deployment:
			checkSelector(t, o, x.Spec.Selector.MatchLabels, x.Spec.Template.Labels)
			checkSA(t, o, sas, x.Namespace, x.Spec.Template.Spec.ServiceAccountName)
		case *apiextv1.CustomResourceDefinition:
			if x.Spec.Group != "forkd.dev" {
				t.Errorf("%s: CRD group %s", o.file, x.Spec.Group)
			}
		}
	}
}

func checkSelector(t *testing.T, o object, sel, labels map[string]string) {
	t.Helper()
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("%s: %s %s: selector %s=%s does not select its pod template (%v)", o.file, o.kind, o.name, k, v, labels)
		}
	}
}

func checkSA(t *testing.T, o object, sas map[string]bool, ns, name string) {
	t.Helper()
	if !sas[ns+"/"+name] {
		t.Errorf("%s: %s %s runs as ServiceAccount %s/%s, which deploy/ does not create", o.file, o.kind, o.name, ns, name)
	}
}

func TestCRDCopiesMatchTheGenerated(t *testing.T) {
	src, _ := filepath.Glob(filepath.Join(root, "k8s/config/crd/*.yaml"))
	if len(src) == 0 {
		t.Fatal("no CRDs in k8s/config/crd")
	}
	for _, dir := range []string{"deploy/manifests/crds", "deploy/helm/forkd/crds"} {
		copies, _ := filepath.Glob(filepath.Join(root, dir, "*.yaml"))
		if len(copies) != len(src) {
			t.Errorf("%s has %d CRDs, k8s/config/crd %d: run deploy/sync-crds.sh", dir, len(copies), len(src))
		}
		for _, s := range src {
			a, _ := os.ReadFile(s)
			b, err := os.ReadFile(filepath.Join(root, dir, filepath.Base(s)))
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("%s/%s differs from %s: run deploy/sync-crds.sh", dir, filepath.Base(s), s)
			}
		}
	}
}

// render renders the chart's templates with its default values, as helm
// template would for these (simple) templates.
func render(t *testing.T, namespace string) []byte {
	t.Helper()
	valuesYAML, err := os.ReadFile(filepath.Join(root, "deploy/helm/forkd/values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(valuesYAML, &values); err != nil {
		t.Fatal(err)
	}
	funcs := template.FuncMap{
		"quote": func(v any) string { return fmt.Sprintf("%q", fmt.Sprint(v)) },
		"toYaml": func(v any) string {
			b, err := yaml.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSuffix(string(b), "\n")
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
	}
	files, _ := filepath.Glob(filepath.Join(root, "deploy/helm/forkd/templates/*.yaml"))
	if len(files) == 0 {
		t.Fatal("no templates")
	}
	var out bytes.Buffer
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := template.New(filepath.Base(f)).Funcs(funcs).Option("missingkey=error").Parse(string(src))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out.WriteString("\n---\n")
		data := map[string]any{"Values": values, "Release": map[string]any{"Namespace": namespace, "Name": "forkd"}}
		if err := tmpl.Execute(&out, data); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return out.Bytes()
}

func TestHelmChartRendersThePlainManifests(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(root, "deploy/helm/forkd/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		APIVersion, Name, Version string
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil || meta.APIVersion != "v2" || meta.Name != "forkd" || meta.Version == "" {
		t.Fatalf("Chart.yaml: %+v, %v", meta, err)
	}
	rendered := decode(t, "helm template", render(t, "forkd-system"))
	byKey := func(objs []object) map[string]map[string]any {
		m := map[string]map[string]any{}
		for _, o := range objs {
			if o.kind == "Namespace" || o.kind == "CustomResourceDefinition" {
				continue // helm --create-namespace; the chart's crds/ are checked above
			}
			m[o.kind+"/"+o.name] = o.raw
		}
		return m
	}
	got, want := byKey(rendered), byKey(plainObjects(t))
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart lacks %s", k)
			continue
		}
		if !reflect.DeepEqual(normalize(t, g), normalize(t, w)) {
			gy, _ := yaml.Marshal(g)
			wy, _ := yaml.Marshal(w)
			t.Errorf("%s differs:\nchart:\n%s\nplain:\n%s", k, gy, wy)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart has %s, the plain manifests do not", k)
		}
	}
}

// normalize turns numbers written as strings by a template (containerPort:
// 7070 either way) into one form by a JSON round trip of the typed object.
func normalize(t *testing.T, raw map[string]any) map[string]any {
	t.Helper()
	b, err := yaml.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// checkService: a Service selects the pods of a Deployment in its
// namespace, and each targetPort names one of their container ports.
func checkService(t *testing.T, o object, svc *corev1.Service, objs []object) {
	t.Helper()
	for _, d := range objs {
		dep, ok := d.obj.(*appsv1.Deployment)
		if !ok || dep.Namespace != svc.Namespace {
			continue
		}
		selects := len(svc.Spec.Selector) > 0
		for k, v := range svc.Spec.Selector {
			selects = selects && dep.Spec.Template.Labels[k] == v
		}
		if !selects {
			continue
		}
		named := map[string]bool{}
		for _, c := range dep.Spec.Template.Spec.Containers {
			for _, p := range c.Ports {
				named[p.Name] = true
			}
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.StrVal == "" || !named[p.TargetPort.StrVal] {
				t.Errorf("%s: Service %s port %s targets %q, which Deployment %s's containers do not name", o.file, svc.Name, p.Name, p.TargetPort.String(), dep.Name)
			}
		}
		return
	}
	t.Errorf("%s: Service %s selects no Deployment's pods in %s", o.file, svc.Name, svc.Namespace)
}
