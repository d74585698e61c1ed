package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SandboxBlueprint is what Sandbox and SandboxTemplate share: what to fork
// and how to confine it. Where agent-sandbox's blueprint is a pod template,
// forkd's is a snapshot reference: a sandbox is a fork of a booted,
// warmed-up microVM, not a pod started from an image.
type SandboxBlueprint struct {
	// snapshot is what the sandbox forks from.
	// +required
	Snapshot SnapshotRef `json:"snapshot"`

	// resources: the CPU cap and the memory placement reserves.
	// +optional
	Resources Resources `json:"resources,omitempty"`

	// network is the sandbox's egress policy. Absent: the snapshot's, or
	// the node daemon's default.
	// +optional
	Network *NetworkPolicy `json:"network,omitempty"`
}

// SandboxTemplateSpec is a reusable blueprint and the lifecycle its
// sandboxes get unless a claim says otherwise.
type SandboxTemplateSpec struct {
	SandboxBlueprint `json:",inline"`

	// lifecycle is the default for the sandboxes of this template.
	// +optional
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
}

// SandboxTemplate names a snapshot and the limits of the sandboxes forked
// from it; SandboxClaims and SandboxWarmPools refer to it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=sbt
// +kubebuilder:printcolumn:name="Snapshot",type="string",JSONPath=".spec.snapshot.tag"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateList is a list of SandboxTemplates.
//
// +kubebuilder:object:root=true
type SandboxTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxTemplate `json:"items"`
}
