package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SandboxClaimSpec asks for one sandbox of a template.
type SandboxClaimSpec struct {
	// sandboxTemplateRef names the template to fork.
	// +required
	TemplateRef LocalRef `json:"sandboxTemplateRef"`

	// warmPoolRef names a pool of the same template to take a ready
	// sandbox from. Absent: any pool of the template; with none ready, the
	// claim forks a new sandbox (milliseconds on a node holding the
	// snapshot, so a pool is an optimisation, not a requirement).
	// +optional
	WarmPoolRef *LocalRef `json:"warmPoolRef,omitempty"`

	// lifecycle overrides the template's.
	// +optional
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
}

// ClaimedSandbox is the sandbox bound to a claim.
type ClaimedSandbox struct {
	// name of the Sandbox object.
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
}

// SandboxClaimStatus is the claim's binding and conditions.
type SandboxClaimStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// +optional
	Sandbox ClaimedSandbox `json:"sandbox,omitempty"`
}

// SandboxClaim is a request for a sandbox from a template: the object a
// user or an SDK creates. The controller binds it to a Sandbox, from a warm
// pool or freshly forked on a node placement picks.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=sbc
// +kubebuilder:printcolumn:name="Template",type="string",JSONPath=".spec.sandboxTemplateRef.name"
// +kubebuilder:printcolumn:name="Sandbox",type="string",JSONPath=".status.sandbox.name"
// +kubebuilder:printcolumn:name="Node",type="string",JSONPath=".status.sandbox.nodeName"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type SandboxClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxClaimSpec `json:"spec"`
	// +optional
	Status SandboxClaimStatus `json:"status,omitempty"`
}

// SandboxClaimList is a list of SandboxClaims.
//
// +kubebuilder:object:root=true
type SandboxClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClaim `json:"items"`
}
