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

	// lifecycle overrides the template's. A pool's sandboxes were forked
	// with the template's timeouts, which a running microVM cannot change:
	// a claim whose timeoutSeconds or idleTimeoutSeconds differ from a
	// pooled sandbox's forks instead of taking it (its shutdownTime and
	// shutdownPolicy, enforced by the controller, apply either way).
	// +optional
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`

	// lostPolicy says what happens when the claim's sandbox is lost with
	// its node (Sandbox phase Lost): Replace (the default) forks a new
	// Sandbox, under a new name, on a live node; Fail leaves the claim
	// Ready False (reason SandboxLost) for its owner to act on.
	//
	// Replace is the default because a claim asks for a sandbox of a
	// template, and the lost one cannot come back under either policy:
	// its memory and disk went with the node. A replacement serves that
	// request again; it starts from the snapshot, with a new sandboxID and
	// endpoint in status.sandbox, so whatever the old one had written is
	// gone. Callers that keep state inside the sandbox, and must notice
	// its loss rather than carry on in a fresh one, set Fail.
	// +kubebuilder:default=Replace
	// +optional
	LostPolicy LostPolicy `json:"lostPolicy,omitempty"`
}

// LostPolicy is what a claim does when its sandbox is lost with its node.
// +kubebuilder:validation:Enum=Replace;Fail
type LostPolicy string

const (
	// LostPolicyReplace forks a new Sandbox for the claim on a live node.
	LostPolicyReplace LostPolicy = "Replace"
	// LostPolicyFail keeps the lost Sandbox bound; the claim is not Ready.
	LostPolicyFail LostPolicy = "Fail"
)

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

	// replacements counts the Sandboxes forked for this claim after one
	// was lost with its node (lostPolicy Replace).
	// +optional
	Replacements int32 `json:"replacements,omitempty"`
}

// SandboxClaim is a request for a sandbox from a template: the object a
// user or an SDK creates. The controller binds it to a Sandbox, taken from
// a warm pool when one has a ready sandbox, else freshly forked on a node
// placement picks.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=sbc
// +kubebuilder:printcolumn:name="Template",type="string",JSONPath=".spec.sandboxTemplateRef.name"
// +kubebuilder:printcolumn:name="Sandbox",type="string",JSONPath=".status.sandbox.name"
// +kubebuilder:printcolumn:name="Node",type="string",JSONPath=".status.sandbox.nodeName"
// +kubebuilder:printcolumn:name="Replaced",type="integer",JSONPath=".status.replacements",priority=1
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
