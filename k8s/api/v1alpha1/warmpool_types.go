package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SandboxWarmPoolSpec keeps replicas sandboxes of a template forked and
// unclaimed.
type SandboxWarmPoolSpec struct {
	// replicas is how many ready, unclaimed sandboxes to keep.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas int32 `json:"replicas"`

	// sandboxTemplateRef names the template the pool forks.
	// +required
	TemplateRef LocalRef `json:"sandboxTemplateRef"`
}

// SandboxWarmPoolStatus counts the pool's sandboxes.
type SandboxWarmPoolStatus struct {
	// replicas is how many unclaimed sandboxes the pool has.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// readyReplicas is how many of them are Running.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// selector selects the pool's Sandboxes (for the scale subresource).
	// +optional
	Selector string `json:"selector,omitempty"`

	// templateHash identifies the template's spec the pool forks now; its
	// Sandboxes carry it in the label forkd.dev/template-hash.
	// +optional
	TemplateHash string `json:"templateHash,omitempty"`

	// updatedReplicas is how many of its sandboxes were forked from the
	// template's spec as it is now. A changed template is rolled out:
	// new sandboxes are forked, and the old ones deleted as the new ones
	// run (claims meanwhile take new ones first).
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`

	// conditions: Ready (True: replicas sandboxes of the current
	// template run; False with reason TemplateNotFound, RollingOut or
	// Filling).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxWarmPool keeps forked sandboxes ready for claims. On forkd a pool
// costs little: its sandboxes share the snapshot's memory until they write.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,shortName=sbwp
// +kubebuilder:printcolumn:name="Template",type="string",JSONPath=".spec.sandboxTemplateRef.name"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxWarmPoolSpec `json:"spec"`
	// +optional
	Status SandboxWarmPoolStatus `json:"status,omitempty"`
}

// SandboxWarmPoolList is a list of SandboxWarmPools.
//
// +kubebuilder:object:root=true
type SandboxWarmPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxWarmPool `json:"items"`
}
