package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SandboxPhase is where a sandbox is in its life.
// +kubebuilder:validation:Enum=Pending;Pulling;Running;Lost;Ended
type SandboxPhase string

const (
	// SandboxPending: not placed yet, or placed and forking.
	SandboxPending SandboxPhase = "Pending"
	// SandboxPulling: its node is pulling the snapshot before forking.
	SandboxPulling SandboxPhase = "Pulling"
	// SandboxRunning: forked and answering on its node.
	SandboxRunning SandboxPhase = "Running"
	// SandboxLost: its node stopped reporting; the microVM is gone with it.
	SandboxLost SandboxPhase = "Lost"
	// SandboxEnded: it exited, timed out or was deleted on its node.
	SandboxEnded SandboxPhase = "Ended"
)

// SandboxSpec is one fork: the blueprint, its lifecycle and, optionally,
// the node it must run on.
type SandboxSpec struct {
	SandboxBlueprint `json:",inline"`

	// +optional
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`

	// nodeName pins the sandbox to a node, skipping placement.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// SandboxStatus is what the controller and the node's daemon report.
type SandboxStatus struct {
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`

	// nodeName is the node placement chose (or spec.nodeName).
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// sandboxID is the id forkd gave the fork on its node (sb-...): the
	// same id the REST API and SDKs take.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`

	// endpoint is the base URL of the sandbox on its node's forkd API.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Sandbox is one microVM forked from a snapshot on one node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=sb
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="Node",type="string",JSONPath=".status.nodeName"
// +kubebuilder:printcolumn:name="ID",type="string",JSONPath=".status.sandboxID"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxSpec `json:"spec"`
	// +optional
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
//
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}
