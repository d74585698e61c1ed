package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/placement"
)

// Finalizer keeps a Sandbox until its microVM is deleted on its node and
// its reservation released.
const Finalizer = "forkd.dev/sandbox"

// Labels the controller puts on the forkd sandbox (the fork's metadata),
// so a fork whose answer was lost can be found on its node.
const (
	MetaNamespace = "forkd.dev/namespace"
	MetaName      = "forkd.dev/name"
	MetaUID       = "forkd.dev/uid"
)

// AnnotationForkMetadata on a Sandbox is a JSON object of strings the fork
// carries as metadata besides the controller's own (which win): the
// cluster gateway puts a fork request's metadata there.
const AnnotationForkMetadata = "forkd.dev/fork-metadata"

// Condition reasons the controller sets besides those of the API package.
const (
	ReasonPlaced       = "Placed"
	ReasonPinned       = "Pinned"
	ReasonForking      = "Forking"
	ReasonForkFailed   = "ForkFailed"
	ReasonPullFailed   = "PullFailed"
	ReasonNodeNotReady = "NodeNotReady"
	ReasonEnded        = "Ended"
)

// SandboxReconciler forks each Sandbox on a node and keeps its status:
//
//   - Pending with no node: placement.Place picks one (or spec.nodeName
//     pins it) and reserves its memory; status.nodeName and the Placed
//     condition are written before the fork, so a retry forks on the same
//     node.
//   - Placed, no sandboxID: POST /v1/sandboxes on the node with the
//     Idempotency-Key k8s-UID, so a retry after a lost answer gets the
//     first fork; a node that does not hold the snapshot (Decision.Pull)
//     first pulls the snapshot's image under its tag (POST
//     /v1/snapshots/pull; phase Pulling meanwhile), then forks it.
//   - Running: GET /v1/sandboxes/{id} every ResyncInterval; a sandbox the
//     node no longer runs is Ended.
//   - lifecycle.shutdownTime passed: DELETE on the node, phase Ended
//     (reason Expired), and the object deleted if shutdownPolicy is
//     Delete.
//   - Deleted: the finalizer DELETEs the microVM on its node (a node lost
//     has nothing left to delete) and releases the reservation.
//
// Node loss is the NodeView's: OnNodeLost marks the node's Sandboxes Lost.
type SandboxReconciler struct {
	Client client.Client
	// Reader reads a Sandbox past the cache (the manager's APIReader;
	// nil: the cache is trusted) when the cache is behind the
	// reconciler's own last status write (see ownWrites): it would place
	// or fork again, which the idempotency key makes harmless but not
	// free (a replayed fork, a conflict, a backoff).
	Reader  client.Reader
	Cluster *placement.Cluster
	Nodes   *NodeView
	// DefaultMemoryBytes is reserved for a sandbox whose blueprint sets no
	// memory and whose snapshot no node reports (default 512 MiB).
	DefaultMemoryBytes int64
	// ForkTimeout bounds a fork (default 2 min), PullTimeout a fork that
	// pulls first (default 15 min), ResyncInterval the check of a Running
	// sandbox (default 1 min), RetryInterval a wait for capacity or a node
	// (default 15 s).
	ForkTimeout, PullTimeout, ResyncInterval, RetryInterval time.Duration
	// Now is the clock (tests set it).
	Now func() time.Time
	// Events records a Sandbox's placement, fork, failures and end.
	Events EventRecorder
	Log    logr.Logger

	// writes are the status writes the cache has not shown yet; asked,
	// when each Sandbox looking for its tag first asked.
	writes ownWrites[progress]
	asked  askedSince
}

func (r *SandboxReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func durationOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Reconcile brings one Sandbox one step closer to running (see the type).
func (r *SandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := req.String()
	var sb v1.Sandbox
	err := r.Client.Get(ctx, req.NamespacedName, &sb)
	if err == nil && r.Reader != nil && r.writes.behind(req.NamespacedName, sb.UID, progressOf(&sb)) {
		if err = r.Reader.Get(ctx, req.NamespacedName, &sb); err == nil {
			r.writes.settle(req.NamespacedName, sb.UID, progressOf(&sb))
		}
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			r.writes.forget(req.NamespacedName)
			r.asked.done(key)
			r.Cluster.Release(key)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !sb.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, key, &sb)
	}
	if !controllerutil.ContainsFinalizer(&sb, Finalizer) {
		controllerutil.AddFinalizer(&sb, Finalizer)
		if err := r.Client.Update(ctx, &sb); err != nil {
			return ctrl.Result{}, err
		}
	}

	switch sb.Status.Phase {
	case v1.SandboxEnded, v1.SandboxLost:
		r.Cluster.Release(key)
		return ctrl.Result{}, nil
	}
	if t := shutdownTime(&sb); t != nil && !r.now().Before(t.Time) {
		return r.expire(ctx, key, &sb)
	}
	if sb.Status.NodeName == "" {
		placed, res, err := r.place(ctx, key, &sb)
		if !placed || err != nil {
			return res, err
		}
	}
	// Placed. A node the view has lost (or, after a restart, never found)
	// took the sandbox with it.
	switch r.Nodes.State(sb.Status.NodeName) {
	case NodeUnknown:
		if r.Nodes.Settled() {
			return ctrl.Result{}, r.setLost(ctx, key, &sb)
		}
		return ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}, nil
	case NodeWaiting:
		return ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}, nil
	}
	// After a controller restart the reservation is rebuilt here (Bind
	// replaces an existing one with the same bytes).
	_ = r.Cluster.Bind(key, sb.Status.NodeName, r.memoryFor(&sb))

	if sb.Status.SandboxID == "" {
		return r.fork(ctx, key, &sb)
	}
	return r.check(ctx, key, &sb)
}

// place picks the node and records it before any fork: in the status,
// or, for a Sandbox bound in its spec (spec.nodeName: pinned by its
// author, or by its claim, see Preplace) to a node that holds its
// snapshot, in the spec already, so the fork's status write records the
// rest and none is made before it.
func (r *SandboxReconciler) place(ctx context.Context, key string, sb *v1.Sandbox) (bool, ctrl.Result, error) {
	retry := ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}
	mem := r.memoryFor(sb)
	var d placement.Decision
	reason, msg := ReasonPlaced, ""
	pin := sb.Spec.NodeName
	tenant := TenantFor(sb.Namespace)
	if pin != "" {
		switch r.Nodes.State(pin) {
		case NodeUp:
		case NodeUnknown:
			if r.Nodes.Settled() {
				// As Kubernetes' pod GC treats a Pod bound to a node that
				// does not exist: its claim, if any, may replace it.
				return false, ctrl.Result{}, r.setLostWith(ctx, key, sb,
					fmt.Sprintf("spec.nodeName %q: no forkd daemon runs there (a node gone, or never in the cluster)", pin))
			}
			fallthrough
		default:
			r.setCondition(sb, v1.ConditionPlaced, metav1.ConditionFalse, ReasonNodeNotReady,
				fmt.Sprintf("spec.nodeName %q: no forkd daemon there has answered yet", pin))
			return false, retry, r.updateStatus(ctx, sb)
		}
		if err := r.Cluster.Bind(key, pin, mem); err != nil {
			return false, ctrl.Result{}, err
		}
		d = placement.Decision{Node: pin, Pull: !r.Nodes.HoldsFor(pin, sb.Spec.Snapshot.Tag, tenant)}
		if d.Pull && sb.Spec.Snapshot.Image == "" {
			r.Cluster.Release(key)
			r.setCondition(sb, v1.ConditionPlaced, metav1.ConditionFalse, v1.ReasonNoCapacity,
				fmt.Sprintf("node %q does not hold snapshot %q and the sandbox names no image to pull it from", pin, sb.Spec.Snapshot.Tag))
			return false, retry, r.updateStatus(ctx, sb)
		}
		reason, msg = ReasonPinned, "spec.nodeName"
	} else {
		var began time.Time
		var err error
		tag := sb.Spec.Snapshot.Tag
		req := placement.Request{Key: key, MemoryBytes: mem, Pullable: sb.Spec.Snapshot.Image != ""}
		snapshotRequest(&req, sb.Namespace, tag)
		d, began, err = r.placeTimed(req)
		sure := true
		if errors.Is(err, placement.ErrNoCapacity) && !r.Nodes.HeldAnywhere(tag, tenant) {
			// Perhaps made on a node since the view's last round (a
			// branch): asked for on every node, by a lookup begun
			// after the Sandbox first asked, so after it exists.
			var held bool
			held, sure = r.Nodes.FindSnapshot(ctx, tag, tenant, r.asked.since(key, tag))
			if held {
				d, began, err = r.placeTimed(req)
			}
		}
		if err == nil || sure {
			r.asked.done(key)
		}
		if err == nil {
			starts.begin(sb.UID, began, d.Pull)
		}
		if errors.Is(err, placement.ErrNoCapacity) {
			reason, msg := v1.ReasonNoCapacity, err.Error()
			switch {
			case req.Pullable || r.Nodes.HeldAnywhere(tag, tenant):
			case !sure:
				// Not yet known absent: looked for again soon.
				msg = fmt.Sprintf("snapshot %q: no node known to hold it for this namespace; still looking on every node", tag)
				retry = ctrl.Result{RequeueAfter: 2 * time.Second}
			default:
				// Not full: absent (a typo, a tag not built yet, one
				// removed, another namespace's), as a daemon's fork of
				// it is a 404.
				reason = v1.ReasonSnapshotNotFound
				msg = fmt.Sprintf("no node holds snapshot %q for this namespace (every node up was asked) and the Sandbox names no image to pull it from", tag)
			}
			sb.Status.Phase = v1.SandboxPending
			r.setCondition(sb, v1.ConditionPlaced, metav1.ConditionFalse, reason, msg)
			record(r.Events, sb, nil, eventWarning, reason, actionPlace, "%s", msg)
			return false, retry, r.updateStatus(ctx, sb)
		}
		if err != nil {
			return false, ctrl.Result{}, err
		}
		msg = "placement"
	}
	sb.Status.NodeName = d.Node
	sb.Status.Phase = v1.SandboxPending
	if d.Pull {
		sb.Status.Phase = v1.SandboxPulling
		reason = v1.ReasonPulling
	}
	r.setCondition(sb, v1.ConditionPlaced, metav1.ConditionTrue, reason,
		fmt.Sprintf("node %s chosen by %s (%d bytes reserved; pull first: %v)", d.Node, msg, mem, d.Pull))
	// Bound in the spec to a holder, the spec records the node already.
	if pin == "" || d.Pull {
		if err := r.updateStatus(ctx, sb); err != nil {
			// The status (and so the decision) was not recorded: forget
			// it, the next reconcile places again.
			r.Cluster.Release(key)
			return false, ctrl.Result{}, err
		}
	}
	record(r.Events, sb, nil, eventNormal, reason, actionPlace, "node %s (%s; pull first: %v)", d.Node, msg, d.Pull)
	return true, ctrl.Result{}, nil
}

// Preplace places a Sandbox its creator (a claim, the gateway) is about
// to create: when a ready node holding its snapshot has room, it reserves
// the room there and names the node in spec.nodeName, so the Sandbox is
// created bound, as a Pod the scheduler has bound, and its fork needs no
// status write before it (see place): one apiserver write fewer on the
// way to a running claim. Otherwise (a node would pull first, none has
// room, the key is placed already, or the node view has not settled: on
// a replica not elected, or just started) the Sandbox is created unbound
// and Reconcile places it, with its conditions. created must be called
// with Create's error: a failed Create (AlreadyExists included: that
// object reserves for itself) gives back the room Preplace reserved, and
// only that.
func (r *SandboxReconciler) Preplace(sb *v1.Sandbox) (created func(error)) {
	noop := func(error) {}
	if sb.Spec.NodeName != "" || !r.Nodes.Settled() {
		return noop
	}
	key := types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}.String()
	req := placement.Request{Key: key, MemoryBytes: r.memoryFor(sb), OnlyNew: true}
	snapshotRequest(&req, sb.Namespace, sb.Spec.Snapshot.Tag)
	d, began, err := r.placeTimed(req)
	if err != nil {
		return noop
	}
	if d.Pull {
		// A node already pulling it: Reconcile places it with the
		// Pulling phase shown.
		r.Cluster.Release(key)
		return noop
	}
	sb.Spec.NodeName = d.Node
	return func(err error) {
		if err != nil {
			r.Cluster.Release(key)
			return
		}
		starts.begin(sb.UID, began, false)
	}
}

// memoryFor is what placement reserves for a sandbox: its blueprint's
// memory, else that of the snapshot its namespace forks as a node
// reports it, else the default.
func (r *SandboxReconciler) memoryFor(sb *v1.Sandbox) int64 {
	if m := sb.Spec.Resources.Memory; m != nil {
		return m.Value()
	}
	if b := r.Nodes.SnapshotMemoryBytes(sb.Spec.Snapshot.Tag, TenantFor(sb.Namespace)); b > 0 {
		return b
	}
	if r.DefaultMemoryBytes > 0 {
		return r.DefaultMemoryBytes
	}
	return 512 << 20
}

// shutdownTime is the sandbox's lifecycle.shutdownTime, or nil.
func shutdownTime(sb *v1.Sandbox) *metav1.Time {
	if sb.Spec.Lifecycle == nil {
		return nil
	}
	return sb.Spec.Lifecycle.ShutdownTime
}

func shutdownPolicy(sb *v1.Sandbox) v1.ShutdownPolicy {
	if sb.Spec.Lifecycle == nil || sb.Spec.Lifecycle.ShutdownPolicy == "" {
		return v1.ShutdownPolicyRetain
	}
	return sb.Spec.Lifecycle.ShutdownPolicy
}

// expire ends a sandbox whose shutdownTime passed.
func (r *SandboxReconciler) expire(ctx context.Context, key string, sb *v1.Sandbox) (ctrl.Result, error) {
	if err := r.deleteOnNode(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	r.Cluster.Release(key)
	return r.end(ctx, sb, v1.ReasonExpired, fmt.Sprintf("lifecycle.shutdownTime %s passed", sb.Spec.Lifecycle.ShutdownTime.UTC().Format(time.RFC3339)))
}

// end marks a sandbox Ended and, under shutdownPolicy Delete, deletes it.
func (r *SandboxReconciler) end(ctx context.Context, sb *v1.Sandbox, reason, msg string) (ctrl.Result, error) {
	sb.Status.Phase = v1.SandboxEnded
	r.setCondition(sb, v1.ConditionReady, metav1.ConditionFalse, reason, msg)
	if err := r.updateStatus(ctx, sb); err != nil {
		return ctrl.Result{}, err
	}
	record(r.Events, sb, nil, eventNormal, reason, actionWatch, "%s", msg)
	if shutdownPolicy(sb) == v1.ShutdownPolicyDelete {
		if err := r.Client.Delete(ctx, sb); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// finalize deletes the microVM on its node, releases the reservation and
// lets the object go.
func (r *SandboxReconciler) finalize(ctx context.Context, key string, sb *v1.Sandbox) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(sb, Finalizer) {
		r.Cluster.Release(key)
		return ctrl.Result{}, nil
	}
	if node := BoundNode(sb); sb.Status.Phase != v1.SandboxLost && sb.Status.Phase != v1.SandboxEnded && node != "" {
		switch r.Nodes.State(node) {
		case NodeUp:
			if err := r.deleteOnNode(ctx, sb); err != nil {
				return ctrl.Result{}, err
			}
		case NodeWaiting:
			// The daemon has not answered yet: wait for it, or for the
			// view to declare the node lost.
			return ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}, nil
		case NodeUnknown:
			if !r.Nodes.Settled() {
				return ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}, nil
			}
			// Lost with its node: nothing to delete.
		}
	}
	r.Cluster.Release(key)
	controllerutil.RemoveFinalizer(sb, Finalizer)
	if err := r.Client.Update(ctx, sb); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// setCondition sets a condition with the object's generation.
func (r *SandboxReconciler) setCondition(sb *v1.Sandbox, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation,
	})
}

func (r *SandboxReconciler) updateStatus(ctx context.Context, sb *v1.Sandbox) error {
	if err := r.Client.Status().Update(ctx, sb); err != nil {
		return err
	}
	r.writes.wrote(client.ObjectKeyFromObject(sb), sb.UID, progressOf(sb))
	return nil
}
