// Package v1alpha1 holds forkd's Kubernetes API: SandboxTemplate (which
// snapshot to fork, with what limits), Sandbox (one forked microVM on one
// node), SandboxClaim (a request for a sandbox from a template, served from
// a warm pool when one has a sandbox ready) and SandboxWarmPool (forked
// sandboxes kept ready). The shapes follow kubernetes-sigs/agent-sandbox
// where they fit; docs/KUBERNETES.md says where and why they differ.
//
// The CRDs in k8s/config/crd are generated from these types:
// `go generate ./api/...` in the k8s module.
//
// +kubebuilder:object:generate=true
// +groupName=forkd.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object crd paths=./ output:crd:artifacts:config=../../config/crd

// GroupVersion names this API.
var GroupVersion = schema.GroupVersion{Group: "forkd.dev", Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers the types of this API with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&SandboxTemplate{}, &SandboxTemplateList{},
		&Sandbox{}, &SandboxList{},
		&SandboxClaim{}, &SandboxClaimList{},
		&SandboxWarmPool{}, &SandboxWarmPoolList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
