package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SnapshotRef names the snapshot a sandbox forks from: a tag as `forkd
// snapshot` makes it on a node, and where to pull it from when no node with
// room holds it.
type SnapshotRef struct {
	// tag is the snapshot's tag on the nodes (py-pandas).
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9._-]{0,63}$`
	// +required
	Tag string `json:"tag"`

	// image is the OCI reference the snapshot was pushed to (forkd push);
	// a node without the tag pulls it from there before forking. Without
	// it, only nodes that already hold the tag are candidates.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`
}

// NetworkMode is what a sandbox may reach; the values are forkd's.
// +kubebuilder:validation:Enum=none;public;allow
type NetworkMode string

const (
	// NetworkNone: nothing, DNS refused.
	NetworkNone NetworkMode = "none"
	// NetworkPublic: the internet, never the node, other sandboxes or
	// private, CGNAT, link-local and multicast ranges.
	NetworkPublic NetworkMode = "public"
	// NetworkAllow: only the entries of allow.
	NetworkAllow NetworkMode = "allow"
)

// NetworkPolicy is forkd's egress policy (docs/NETWORK.md), enforced on the
// node by the daemon, not a Kubernetes NetworkPolicy: a sandbox is a
// microVM behind the node's forkd uplink, not a pod on the cluster network.
type NetworkPolicy struct {
	// +required
	Mode NetworkMode `json:"mode"`

	// allow lists networks (198.51.100.0/24, 203.0.113.7:443/tcp) and
	// domain names (example.com, *.example.com) when mode is allow.
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Allow []string `json:"allow,omitempty"`

	// maxConnections caps the TCP connections open through the uplink at
	// once (0: no cap).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1048576
	// +optional
	MaxConnections int32 `json:"maxConnections,omitempty"`

	// rateMbit caps the traffic each way in Mbit/s (0: no cap).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	RateMbit int32 `json:"rateMbit,omitempty"`
}

// Resources are what a sandbox is given and what placement reserves for it.
type Resources struct {
	// cpu caps the sandbox's CPU (500m: half a CPU), up to the snapshot's
	// vCPUs. Absent: one CPU per vCPU plus half a CPU for the VMM.
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`

	// memory is what placement reserves on a node for one sandbox. A fork's
	// memory size is the snapshot's and cannot change; its pages are shared
	// with the snapshot until written, so a smaller reservation overcommits
	// knowingly. Absent: the snapshot's memory size as its node reports it.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// ShutdownPolicy says what happens to the object when its sandbox ends.
// +kubebuilder:validation:Enum=Delete;Retain
type ShutdownPolicy string

const (
	// ShutdownPolicyDelete deletes the object once its sandbox has ended.
	ShutdownPolicyDelete ShutdownPolicy = "Delete"
	// ShutdownPolicyRetain keeps the object, its status saying why it ended.
	ShutdownPolicyRetain ShutdownPolicy = "Retain"
)

// Lifecycle bounds how long a sandbox lives.
type Lifecycle struct {
	// shutdownTime ends the sandbox at this time.
	// +optional
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`

	// timeoutSeconds ends the sandbox this long after it was forked
	// (0: no limit). Absent: the node daemon's default.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=604800
	// +optional
	TimeoutSeconds *int64 `json:"timeoutSeconds,omitempty"`

	// idleTimeoutSeconds ends a sandbox that received no request for this
	// long (0: no limit).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=604800
	// +optional
	IdleTimeoutSeconds *int64 `json:"idleTimeoutSeconds,omitempty"`

	// shutdownPolicy: Delete or Retain (the default) the object when its
	// sandbox ends.
	// +kubebuilder:default=Retain
	// +optional
	ShutdownPolicy ShutdownPolicy `json:"shutdownPolicy,omitempty"`
}

// LocalRef names an object in the same namespace.
type LocalRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// Condition types and reasons shared by Sandbox and SandboxClaim.
const (
	// ConditionReady: the sandbox answers on its node.
	ConditionReady = "Ready"
	// ConditionPlaced: a node was chosen (status.nodeName).
	ConditionPlaced = "Placed"

	// ReasonForked: the node forked the sandbox.
	ReasonForked = "Forked"
	// ReasonPulling: the chosen node is pulling the snapshot first.
	ReasonPulling = "PullingSnapshot"
	// ReasonNoCapacity: no ready node holding the snapshot (or, with an
	// image, none at all) has the memory.
	ReasonNoCapacity = "NoCapacity"
	// ReasonSnapshotNotFound: no node holds the snapshot for the
	// Sandbox's namespace and it names no image to pull it from, or the
	// node chosen answered that it holds none the namespace may fork
	// (another namespace's). Retried, in case it appears.
	ReasonSnapshotNotFound = "SnapshotNotFound"
	// ReasonNodeLost: the node stopped reporting; the sandbox is gone.
	ReasonNodeLost = "NodeLost"
	// ReasonExpired: its lifetime ran out.
	ReasonExpired = "Expired"
)
