package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// This file holds how a claim takes a Sandbox from a warm pool.

// takeFromPool takes a Running, unclaimed Sandbox of the claim's pools for
// the claim, or returns nil when there is none to take; either way the
// claim's WarmPool condition says what happened.
//
// Taking is one Update of the Sandbox as it was read: its controller
// reference moves from the pool to the claim and LabelPool gives way to
// LabelClaim. Two claims that read the same Sandbox both send its
// resourceVersion; the apiserver accepts the first and refuses the second
// with a Conflict, and the loser goes on to the next candidate. So no two
// claims ever control one Sandbox.
func (r *ClaimReconciler) takeFromPool(ctx context.Context, claim *v1.SandboxClaim) (*v1.Sandbox, error) {
	pools, reason, msg, err := r.poolsFor(ctx, claim)
	if err != nil {
		return nil, err
	}
	if len(pools) == 0 {
		r.setCondition(claim, ConditionWarmPool, metav1.ConditionFalse, reason, msg+"; forked")
		return nil, nil
	}
	var list v1.SandboxList
	if err := r.Client.List(ctx, &list, client.InNamespace(claim.Namespace),
		client.MatchingLabels{LabelTemplate: claim.Spec.TemplateRef.Name}, client.HasLabels{LabelPool}); err != nil {
		return nil, err
	}
	var candidates []*v1.Sandbox
	otherTimeouts := 0
	for i := range list.Items {
		sb := &list.Items[i]
		switch {
		case !takeable(sb, pools):
		case lifecycleFits(claim, sb):
			candidates = append(candidates, sb)
		default:
			otherTimeouts++
		}
	}
	// A pool rolling out a changed template still holds Sandboxes of its
	// earlier spec: the current ones go first, then by name.
	current := map[string]string{} // pool name -> its template hash
	for _, p := range pools {
		current[p.Name] = p.Status.TemplateHash
	}
	isCurrent := func(sb *v1.Sandbox) bool {
		h := current[sb.Labels[LabelPool]]
		return h != "" && sb.Labels[LabelTemplateHash] == h
	}
	slices.SortFunc(candidates, func(a, b *v1.Sandbox) int {
		if ca, cb := isCurrent(a), isCurrent(b); ca != cb {
			if ca {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	if len(candidates) > 0 {
		if err := r.unboundPastCache(ctx, claim); err != nil {
			return nil, err
		}
	}
	for _, sb := range candidates {
		taken, err := r.take(ctx, claim, sb, pools)
		if err != nil {
			return nil, err
		}
		if taken != nil {
			pool := metav1.GetControllerOf(sb).Name
			r.setCondition(claim, ConditionWarmPool, metav1.ConditionTrue, ReasonTakenFromPool,
				fmt.Sprintf("took Sandbox %s from warm pool %s", taken.Name, pool))
			record(r.Events, claim, taken, eventNormal, ReasonTakenFromPool, actionBind, "took Sandbox %s from warm pool %s", taken.Name, pool)
			return taken, nil
		}
	}
	msg = fmt.Sprintf("no ready Sandbox to take in warm pool %s", poolNames(pools))
	if otherTimeouts > 0 {
		msg += fmt.Sprintf(" (%d ready with timeouts other than the claim's lifecycle)", otherTimeouts)
	}
	r.setCondition(claim, ConditionWarmPool, metav1.ConditionFalse, ReasonNoneReady, msg+"; forked")
	return nil, nil
}

// poolConditionOf gives a claim binding a Sandbox made or taken earlier,
// with no WarmPool condition (the reconcile that made it ran before a
// restart, or its status write was lost), the condition it would have
// set: a pool's Sandbox (named by the pool: POOL-xxxxx) was taken; else
// it forked, for the reason its pools give now. A failure to list them
// leaves the condition unset (it is only what happened, and the binding
// must not wait for it).
func (r *ClaimReconciler) poolConditionOf(ctx context.Context, claim *v1.SandboxClaim, sb *v1.Sandbox) {
	if meta.FindStatusCondition(claim.Status.Conditions, ConditionWarmPool) != nil {
		return
	}
	if pool := strings.TrimSuffix(sb.GenerateName, "-"); pool != "" && sb.Name != claim.Name {
		r.setCondition(claim, ConditionWarmPool, metav1.ConditionTrue, ReasonTakenFromPool,
			fmt.Sprintf("took Sandbox %s from warm pool %s", sb.Name, pool))
		return
	}
	pools, reason, msg, err := r.poolsFor(ctx, claim)
	if err != nil {
		r.Log.Error(err, "listing warm pools for a claim's WarmPool condition", "claim", client.ObjectKeyFromObject(claim).String())
		return
	}
	if len(pools) > 0 {
		reason, msg = ReasonNoneReady, fmt.Sprintf("no ready Sandbox to take in warm pool %s", poolNames(pools))
	}
	r.setCondition(claim, ConditionWarmPool, metav1.ConditionFalse, reason, msg+"; forked")
}

// errBoundPastCache: the apiserver's copy of the claim names a Sandbox
// the cached one does not (or the claim is gone); it takes nothing now.
var errBoundPastCache = errors.New("the claim is bound in the apiserver's copy, not yet in the cache")

// unboundPastCache reads the claim past the cache (the Reader) before it
// takes a Sandbox: a cache behind the claim's own status write, naming
// one it took, must not make it take a second. One GET; a LIST of
// Sandboxes past the cache would cost the namespace's Sandboxes (57-76 ms
// of a claim's ~90 with 520 of them in the load test). What this leaves:
// a take whose status write failed, while the cache also lags behind the
// take, may take a second one (each is the claim's; the unnamed one goes
// with the claim).
func (r *ClaimReconciler) unboundPastCache(ctx context.Context, claim *v1.SandboxClaim) error {
	if r.Reader == nil {
		return nil
	}
	var fresh v1.SandboxClaim
	if err := r.Reader.Get(ctx, client.ObjectKeyFromObject(claim), &fresh); err != nil {
		if apierrors.IsNotFound(err) {
			return errBoundPastCache
		}
		return err
	}
	if fresh.Status.Sandbox.Name != "" {
		return errBoundPastCache
	}
	return nil
}

// take tries to make sb the claim's. A nil Sandbox and nil error: another
// writer got there first (a claim took it, or the pool deleted it). A
// conflict with a write that left it takeable (its status updated) is
// tried once more on a fresh read.
func (r *ClaimReconciler) take(ctx context.Context, claim *v1.SandboxClaim, sb *v1.Sandbox, pools []*v1.SandboxWarmPool) (*v1.Sandbox, error) {
	for try := 0; ; try++ {
		upd := sb.DeepCopy()
		refs := upd.OwnerReferences[:0]
		for _, ref := range upd.OwnerReferences {
			if ref.Controller == nil || !*ref.Controller {
				refs = append(refs, ref)
			}
		}
		upd.OwnerReferences = refs
		if err := controllerutil.SetControllerReference(claim, upd, r.Scheme); err != nil {
			return nil, err
		}
		delete(upd.Labels, LabelPool)
		upd.Labels[LabelClaim] = claim.Name
		if claim.Spec.Lifecycle != nil {
			upd.Spec.Lifecycle = claim.Spec.Lifecycle.DeepCopy()
		}
		err := r.Client.Update(ctx, upd) // carries sb's resourceVersion
		switch {
		case err == nil:
			return upd, nil
		case apierrors.IsNotFound(err):
			return nil, nil
		case !apierrors.IsConflict(err):
			return nil, err
		}
		if try > 0 {
			return nil, nil
		}
		var fresh v1.Sandbox
		if err := r.reader().Get(ctx, client.ObjectKeyFromObject(sb), &fresh); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		if !takeable(&fresh, pools) {
			return nil, nil
		}
		sb = &fresh
	}
}

// poolsFor is the pools a claim may take from: its warmPoolRef, else
// every pool of its template in its namespace, less those being deleted.
// None: the reason and message say why.
func (r *ClaimReconciler) poolsFor(ctx context.Context, claim *v1.SandboxClaim) ([]*v1.SandboxWarmPool, string, string, error) {
	tmpl := claim.Spec.TemplateRef.Name
	if ref := claim.Spec.WarmPoolRef; ref != nil {
		var pool v1.SandboxWarmPool
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: ref.Name}, &pool)
		switch {
		case apierrors.IsNotFound(err):
			return nil, ReasonPoolNotFound, fmt.Sprintf("warm pool %s not found", ref.Name), nil
		case err != nil:
			return nil, "", "", err
		case pool.Spec.TemplateRef.Name != tmpl:
			return nil, ReasonPoolTemplateMismatch,
				fmt.Sprintf("warm pool %s forks template %s, not the claim's %s", ref.Name, pool.Spec.TemplateRef.Name, tmpl), nil
		case !pool.DeletionTimestamp.IsZero():
			return nil, ReasonNoneReady, fmt.Sprintf("warm pool %s is being deleted", ref.Name), nil
		}
		return []*v1.SandboxWarmPool{&pool}, "", "", nil
	}
	var list v1.SandboxWarmPoolList
	if err := r.Client.List(ctx, &list, client.InNamespace(claim.Namespace)); err != nil {
		return nil, "", "", err
	}
	var pools []*v1.SandboxWarmPool
	for i := range list.Items {
		if p := &list.Items[i]; p.Spec.TemplateRef.Name == tmpl && p.DeletionTimestamp.IsZero() {
			pools = append(pools, p)
		}
	}
	if len(pools) == 0 {
		return nil, ReasonNoPool, fmt.Sprintf("no warm pool of template %s", tmpl), nil
	}
	return pools, "", "", nil
}

// takeable says sb is a Running Sandbox one of pools controls, not being
// deleted.
func takeable(sb *v1.Sandbox, pools []*v1.SandboxWarmPool) bool {
	if sb.Status.Phase != v1.SandboxRunning || !sb.DeletionTimestamp.IsZero() || sb.Labels[LabelPool] == "" {
		return false
	}
	return slices.ContainsFunc(pools, func(p *v1.SandboxWarmPool) bool { return metav1.IsControlledBy(sb, p) })
}

// lifecycleFits says the claim may take sb: a running microVM's timeouts
// were fixed when it was forked, so a claim that sets its own must match
// them (its shutdownTime and shutdownPolicy the controller enforces, so
// they apply to any Sandbox).
func lifecycleFits(claim *v1.SandboxClaim, sb *v1.Sandbox) bool {
	want := claim.Spec.Lifecycle
	if want == nil {
		return true
	}
	var have v1.Lifecycle
	if sb.Spec.Lifecycle != nil {
		have = *sb.Spec.Lifecycle
	}
	return equalSeconds(want.TimeoutSeconds, have.TimeoutSeconds) && equalSeconds(want.IdleTimeoutSeconds, have.IdleTimeoutSeconds)
}

func equalSeconds(a, b *int64) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func poolNames(pools []*v1.SandboxWarmPool) string {
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}
