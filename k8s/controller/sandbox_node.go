package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// This file holds what the Sandbox reconciler asks of the node daemons:
// the fork, the check of a running sandbox, the delete, and what node
// loss does to Sandboxes.

// idempotencyKey is the fork's Idempotency-Key: one per Sandbox object, so
// every retry of its fork, by this controller or its successor, gets the
// first answer.
func idempotencyKey(sb *v1.Sandbox) string { return "k8s-" + string(sb.UID) }

// forkRequest is the fork body for a sandbox.
func forkRequest(sb *v1.Sandbox) apiForkRequest {
	req := apiForkRequest{Tag: sb.Spec.Snapshot.Tag, Count: 1, Metadata: map[string]string{}}
	if a := sb.Annotations[AnnotationForkMetadata]; a != "" {
		// Not an object of strings: left out (the gateway writes it
		// checked; a hand-made one is not worth failing the fork).
		var m map[string]string
		if json.Unmarshal([]byte(a), &m) == nil {
			maps.Copy(req.Metadata, m)
		}
	}
	req.Metadata[MetaNamespace] = sb.Namespace
	req.Metadata[MetaName] = sb.Name
	req.Metadata[MetaUID] = string(sb.UID)
	if lc := sb.Spec.Lifecycle; lc != nil {
		req.TimeoutSeconds = lc.TimeoutSeconds
		if lc.IdleTimeoutSeconds != nil {
			req.IdleTimeoutSeconds = *lc.IdleTimeoutSeconds
		}
	}
	if n := sb.Spec.Network; n != nil {
		req.Network = &apiNetworkPolicy{
			Mode:           string(n.Mode),
			Allow:          n.Allow,
			MaxConnections: int(n.MaxConnections),
			RateMbit:       int(n.RateMbit),
		}
	}
	if c := sb.Spec.Resources.CPU; c != nil {
		req.CPUs = float64(c.MilliValue()) / 1000
	}
	return req
}

// fork creates the microVM on the sandbox's node.
func (r *SandboxReconciler) fork(ctx context.Context, key string, sb *v1.Sandbox) (ctrl.Result, error) {
	c, ok := r.Nodes.Client(sb.Status.NodeName)
	if !ok {
		return ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}, nil
	}
	pull := sb.Status.Phase == v1.SandboxPulling
	timeout := durationOr(r.ForkTimeout, 2*time.Minute)
	if pull {
		timeout = durationOr(r.PullTimeout, 15*time.Minute)
	}
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if pull {
		// Under the template's tag, so the node then reports holding it
		// and placement sends later sandboxes there as to any holder.
		if err := c.PullSnapshot(fctx, "k8s-pull-"+string(sb.UID), TenantFor(sb.Namespace), sb.Spec.Snapshot.Image, sb.Spec.Snapshot.Tag); err != nil {
			return r.forkFailed(ctx, key, sb, pull, err)
		}
	}
	resp, err := c.Fork(fctx, idempotencyKey(sb), TenantFor(sb.Namespace), forkRequest(sb))
	if err != nil {
		return r.forkFailed(ctx, key, sb, pull, err)
	}
	if len(resp.Sandboxes) != 1 || resp.Sandboxes[0].ID == "" {
		return ctrl.Result{}, fmt.Errorf("fork on node %s: the daemon answered %d sandboxes, want 1", sb.Status.NodeName, len(resp.Sandboxes))
	}
	id := resp.Sandboxes[0].ID
	sb.Status.SandboxID = id
	sb.Status.Endpoint = strings.TrimSuffix(c.Base, "/") + "/v1/sandboxes/" + id
	sb.Status.Phase = v1.SandboxRunning
	r.setCondition(sb, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked,
		fmt.Sprintf("forked %s on node %s", id, sb.Status.NodeName))
	if err := r.updateStatus(ctx, sb); err != nil {
		// The fork stands; the retry's fork with the same key gets the
		// same sandbox back.
		return ctrl.Result{}, err
	}
	record(r.Events, sb, nil, eventNormal, v1.ReasonForked, actionFork, "sandbox %s on node %s (the daemon's fork took %.1f ms)", id, sb.Status.NodeName, resp.TotalMs)
	observeRunning(sb, resp.TotalMs)
	return r.requeueRunning(sb), nil
}

// forkFailed decides what a failed fork means.
func (r *SandboxReconciler) forkFailed(ctx context.Context, key string, sb *v1.Sandbox, pull bool, err error) (ctrl.Result, error) {
	retryAfter := durationOr(r.RetryInterval, 15*time.Second)
	switch st := statusOf(err); {
	case st == http.StatusConflict:
		// The same key's fork is still running (the daemon's answer to a
		// concurrent retry): ask again soon.
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	case pull && (st == http.StatusNotFound || st == http.StatusForbidden || st == http.StatusBadRequest || errors.Is(err, errTagTaken)):
		// The image could not be pulled there (or the tag is another
		// namespace's there): stop sending sandboxes to wait for it,
		// and place this one again.
		snapKey, _ := snapshotKeys(sb.Namespace, sb.Spec.Snapshot.Tag)
		r.Cluster.PullFailed(sb.Status.NodeName, snapKey)
		r.Cluster.Release(key)
		node := sb.Status.NodeName
		sb.Status.NodeName = ""
		sb.Status.Phase = v1.SandboxPending
		r.setCondition(sb, v1.ConditionPlaced, metav1.ConditionFalse, ReasonPullFailed,
			fmt.Sprintf("node %s could not pull %s: %v", node, sb.Spec.Snapshot.Image, err))
		record(r.Events, sb, nil, eventWarning, ReasonPullFailed, actionFork, "node %s could not pull %s: %v", node, sb.Spec.Snapshot.Image, err)
		return ctrl.Result{RequeueAfter: retryAfter}, r.updateStatus(ctx, sb)
	case st >= 400 && st < 500 && st != http.StatusTooManyRequests:
		// Refused for good (a bad body, an unknown tag, another
		// namespace's snapshot): say so, retry slowly in case the node
		// changes (a snapshot created or shared later).
		reason := ReasonForkFailed
		if st == http.StatusNotFound {
			reason = v1.ReasonSnapshotNotFound
		}
		r.setCondition(sb, v1.ConditionReady, metav1.ConditionFalse, reason, err.Error())
		record(r.Events, sb, nil, eventWarning, reason, actionFork, "%v", err)
		return ctrl.Result{RequeueAfter: 4 * retryAfter}, r.updateStatus(ctx, sb)
	default:
		// Unavailable, 429, 5xx, no answer: controller-runtime backs off.
		r.setCondition(sb, v1.ConditionReady, metav1.ConditionFalse, ReasonForking, err.Error())
		if uerr := r.updateStatus(ctx, sb); uerr != nil {
			r.Log.Error(uerr, "recording a failed fork", "sandbox", key)
		}
		return ctrl.Result{}, err
	}
}

// requeueRunning is when a running sandbox is looked at next: its check,
// or its shutdownTime if sooner.
func (r *SandboxReconciler) requeueRunning(sb *v1.Sandbox) ctrl.Result {
	next := durationOr(r.ResyncInterval, time.Minute)
	if t := shutdownTime(sb); t != nil {
		if d := t.Sub(r.now()); d < next {
			next = max(d, time.Millisecond)
		}
	}
	return ctrl.Result{RequeueAfter: next}
}

// check asks the node whether a running sandbox still runs.
func (r *SandboxReconciler) check(ctx context.Context, key string, sb *v1.Sandbox) (ctrl.Result, error) {
	c, ok := r.Nodes.Client(sb.Status.NodeName)
	if !ok {
		return ctrl.Result{RequeueAfter: durationOr(r.RetryInterval, 15*time.Second)}, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := c.Sandbox(cctx, sb.Status.SandboxID)
	switch {
	case statusOf(err) == http.StatusNotFound:
		r.Cluster.Release(key)
		return r.end(ctx, sb, ReasonEnded, fmt.Sprintf("node %s no longer has sandbox %s", sb.Status.NodeName, sb.Status.SandboxID))
	case err != nil:
		// The node view decides whether the node is gone.
		r.Log.Info("checking a sandbox on its node failed", "sandbox", key, "error", err.Error())
		return r.requeueRunning(sb), nil
	case s.State == "dead" || s.State == "stopped":
		r.Cluster.Release(key)
		msg := fmt.Sprintf("sandbox %s is %s on node %s", s.ID, s.State, sb.Status.NodeName)
		if s.DeadReason != "" {
			msg += ": " + s.DeadReason
		}
		return r.end(ctx, sb, ReasonEnded, msg)
	}
	return r.requeueRunning(sb), nil
}

// deleteOnNode deletes the sandbox's microVM on its node: by id, or, when
// the fork's answer was never recorded, every sandbox the node holds with
// this object's UID in its metadata. A lost node has nothing to delete.
func (r *SandboxReconciler) deleteOnNode(ctx context.Context, sb *v1.Sandbox) error {
	node := BoundNode(sb)
	if node == "" {
		return nil
	}
	c, ok := r.Nodes.Client(node)
	if !ok {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if sb.Status.SandboxID != "" {
		return c.DeleteSandbox(dctx, sb.Status.SandboxID)
	}
	found, err := c.SandboxesLabelled(dctx, MetaUID, string(sb.UID))
	if err != nil {
		return err
	}
	for _, s := range found {
		if err := c.DeleteSandbox(dctx, s.ID); err != nil {
			return err
		}
	}
	return nil
}

// setLost marks one Sandbox Lost with its node.
func (r *SandboxReconciler) setLost(ctx context.Context, key string, sb *v1.Sandbox) error {
	return r.setLostWith(ctx, key, sb, fmt.Sprintf("node %s stopped reporting; the sandbox is gone with it", BoundNode(sb)))
}

// setLostWith marks one Sandbox Lost with its node, saying msg.
func (r *SandboxReconciler) setLostWith(ctx context.Context, key string, sb *v1.Sandbox, msg string) error {
	r.Cluster.Release(key)
	sb.Status.NodeName = BoundNode(sb)
	sb.Status.Phase = v1.SandboxLost
	r.setCondition(sb, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonNodeLost, msg)
	if err := r.updateStatus(ctx, sb); err != nil {
		return err
	}
	record(r.Events, sb, nil, eventWarning, v1.ReasonNodeLost, actionWatch, "%s", msg)
	return nil
}

// BoundNode is the node a Sandbox is bound to: its status's, else its
// spec's (a Sandbox created bound may fork there before its status names
// the node, see SandboxReconciler.place).
func BoundNode(sb *v1.Sandbox) string {
	if sb.Status.NodeName != "" {
		return sb.Status.NodeName
	}
	return sb.Spec.NodeName
}

// live says a phase still has a microVM (or is making one) on its node.
func live(p v1.SandboxPhase) bool { return p != v1.SandboxLost && p != v1.SandboxEnded }

// MarkNodeLost marks every live Sandbox on node Lost (NodeView.OnNodeLost).
func (r *SandboxReconciler) MarkNodeLost(ctx context.Context, node string, _ []string) {
	var list v1.SandboxList
	if err := r.Client.List(ctx, &list, client.MatchingFields{IndexNodeName: node}); err != nil {
		// Each Sandbox's own reconcile finds the node unknown and marks
		// it then.
		r.Log.Error(err, "listing the Sandboxes of a lost node", "node", node)
		return
	}
	for i := range list.Items {
		sb := &list.Items[i]
		if BoundNode(sb) != node || !live(sb.Status.Phase) {
			continue
		}
		nn := types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur v1.Sandbox
			if err := r.Client.Get(ctx, nn, &cur); err != nil {
				return err
			}
			if BoundNode(&cur) != node || !live(cur.Status.Phase) {
				return nil
			}
			return r.setLost(ctx, nn.String(), &cur)
		})
		if err != nil && !apierrors.IsNotFound(err) {
			r.Log.Error(err, "marking a Sandbox lost", "sandbox", nn.String(), "node", node)
		}
	}
}

// BindNode reserves, for a node that just answered, the memory of the live
// Sandboxes already on it (NodeView.OnNodeUp): after a restart, placement
// learns them before it places anything new there.
func (r *SandboxReconciler) BindNode(ctx context.Context, node string) {
	var list v1.SandboxList
	if err := r.Client.List(ctx, &list, client.MatchingFields{IndexNodeName: node}); err != nil {
		r.Log.Error(err, "listing Sandboxes to rebuild a node's reservations", "node", node)
		return
	}
	for i := range list.Items {
		sb := &list.Items[i]
		if BoundNode(sb) == node && live(sb.Status.Phase) && sb.DeletionTimestamp.IsZero() {
			key := types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}.String()
			if err := r.Cluster.Bind(key, node, r.memoryFor(sb)); err != nil {
				r.Log.Error(err, "rebinding a Sandbox", "sandbox", key)
			}
		}
	}
}

// IndexNodeName indexes Sandboxes by the node they are bound to
// (BoundNode: status.nodeName, else spec.nodeName), so a node's
// Sandboxes are found without listing every one (a node lost or back
// after a restart: O(its sandboxes), not O(all of them), which at 1,000
// nodes and 30,000 Sandboxes took minutes; docs/SCALE.md).
const IndexNodeName = "status.nodeName"

// NodeNameOf is the index function of IndexNodeName.
func NodeNameOf(o client.Object) []string {
	sb, ok := o.(*v1.Sandbox)
	if !ok || BoundNode(sb) == "" {
		return nil
	}
	return []string{BoundNode(sb)}
}
