package controller

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// This file holds what a claim does when its Sandbox is lost with its
// node (SandboxReconciler.MarkNodeLost sets phase Lost).
//
// Under lostPolicy Replace, in this order, so that a crash or a failed
// write at any step resumes without forking twice or leaking the lost
// Sandbox:
//
//  1. The claim's status names the replacement (claimName-rN, N the new
//     status.replacements), with the Replacing condition True and Ready
//     False. The write carries the claim's resourceVersion, so two
//     reconciles cannot both count a replacement.
//  2. While Replacing is True, each reconcile deletes the claim's lost
//     Sandboxes other than the one named (the finalizer of a Lost Sandbox
//     asks nothing of its dead node: it releases and lets go), then gets
//     the named one, creating it if it does not exist; then Replacing
//     turns False (reason Replaced).
//  3. The new Sandbox is placed like any other: the lost node is out of
//     placement (RemoveNode), so it lands on a live one, and the claim
//     mirrors it from then on.

// lost handles a claim whose bound Sandbox sb is Lost.
func (r *ClaimReconciler) lost(ctx context.Context, claim *v1.SandboxClaim, sb *v1.Sandbox, orig *v1.SandboxClaimStatus) (ctrl.Result, error) {
	msg := fmt.Sprintf("Sandbox %s was lost with node %s", sb.Name, sb.Status.NodeName)
	if claim.Spec.LostPolicy == v1.LostPolicyFail {
		r.mirror(claim, sb)
		r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, ReasonSandboxLost, msg+"; lostPolicy Fail: not replaced")
		if err := r.updateStatus(ctx, claim, orig); err != nil {
			return ctrl.Result{}, err
		}
		if !equalConditions(orig.Conditions, claim.Status.Conditions) {
			record(r.Events, claim, sb, eventWarning, ReasonSandboxLost, actionWatch, "%s; lostPolicy Fail: not replaced", msg)
		}
		return ctrl.Result{}, nil
	}
	claim.Status.Replacements++
	name := replacementName(claim.Name, claim.Status.Replacements)
	claim.Status.Sandbox = v1.ClaimedSandbox{Name: name}
	msg = fmt.Sprintf("%s; Sandbox %s forks in its place", msg, name)
	r.setCondition(claim, ConditionReplacing, metav1.ConditionTrue, v1.ReasonNodeLost, msg)
	r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, ReasonReplacing, msg)
	if err := r.updateStatus(ctx, claim, orig); err != nil {
		return ctrl.Result{}, err
	}
	record(r.Events, claim, sb, eventWarning, ReasonReplacing, actionBind, "%s", msg)
	orig = claim.Status.DeepCopy()
	_, res, err := r.boundSandbox(ctx, claim)
	if uerr := r.updateStatus(ctx, claim, orig); uerr != nil && err == nil {
		err = uerr
	}
	return res, err
}

// replacing says the claim is replacing a lost Sandbox (step 2 above).
func replacing(claim *v1.SandboxClaim) bool {
	return meta.IsStatusConditionTrue(claim.Status.Conditions, ConditionReplacing)
}

// replaced ends step 2: the named replacement exists.
func (r *ClaimReconciler) replaced(claim *v1.SandboxClaim) {
	c := meta.FindStatusCondition(claim.Status.Conditions, ConditionReplacing)
	r.setCondition(claim, ConditionReplacing, metav1.ConditionFalse, ReasonReplaced, c.Message)
}

// deleteLost deletes the claim's Lost Sandboxes other than keep.
func (r *ClaimReconciler) deleteLost(ctx context.Context, claim *v1.SandboxClaim, keep string) error {
	mine, err := r.ownSandboxes(ctx, claim, r.Client)
	if err != nil {
		return err
	}
	for _, sb := range mine {
		if sb.Name == keep || sb.Status.Phase != v1.SandboxLost {
			continue
		}
		if err := r.Client.Delete(ctx, sb); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// replacementName is the name of a claim's n-th replacement Sandbox:
// claimName-rN, the claim's name shortened to fit 253 characters.
func replacementName(claim string, n int32) string {
	suffix := fmt.Sprintf("-r%d", n)
	if len(claim)+len(suffix) > 253 {
		claim = strings.TrimRight(claim[:253-len(suffix)], ".-")
	}
	return claim + suffix
}
