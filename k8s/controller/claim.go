package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// Labels on the Sandboxes a claim creates.
const (
	LabelClaim    = "forkd.dev/claim"
	LabelTemplate = "forkd.dev/template"
)

// Claim condition reasons.
const (
	ReasonTemplateNotFound = "TemplateNotFound"
	ReasonSandboxGone      = "SandboxGone"
	ReasonNameTaken        = "NameTaken"
	ReasonNotImplemented   = "NotImplemented"
	// ConditionWarmPool reports on the claim's warmPoolRef: pools are not
	// served yet, the claim forks.
	ConditionWarmPool = "WarmPool"
)

// ClaimReconciler binds each SandboxClaim to a Sandbox: it creates one,
// named as the claim and owned by it (so deleting the claim deletes the
// Sandbox, and the Sandbox's finalizer its microVM), from the claim's
// template, with the claim's lifecycle over the template's; then it
// copies the Sandbox's node, id and endpoint into the claim's status and
// mirrors its readiness.
//
// Not yet: taking a ready Sandbox from a warm pool (the claim always
// forks; a claim naming a pool says so in its WarmPool condition), and
// replacing a Sandbox lost with its node.
type ClaimReconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	Log    logr.Logger
}

// Reconcile binds one claim.
func (r *ClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var claim v1.SandboxClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !claim.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // the owner reference takes the Sandbox
	}
	orig := claim.Status.DeepCopy()
	if claim.Spec.WarmPoolRef != nil {
		r.setCondition(&claim, ConditionWarmPool, metav1.ConditionFalse, ReasonNotImplemented,
			fmt.Sprintf("warm pool %q not used: the controller does not serve pools yet; the claim forks", claim.Spec.WarmPoolRef.Name))
	}

	var sb v1.Sandbox
	nn := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	if claim.Status.Sandbox.Name != "" {
		nn.Name = claim.Status.Sandbox.Name
	}
	err := r.Client.Get(ctx, nn, &sb)
	switch {
	case apierrors.IsNotFound(err) && claim.Status.Sandbox.Name != "":
		// Bound once, now gone (shutdownPolicy Delete, or deleted by
		// hand): the claim is over; it does not fork again.
		r.setCondition(&claim, v1.ConditionReady, metav1.ConditionFalse, ReasonSandboxGone,
			fmt.Sprintf("Sandbox %s no longer exists", nn.Name))
		return ctrl.Result{}, r.updateStatus(ctx, &claim, orig)
	case apierrors.IsNotFound(err):
		created, res, err := r.create(ctx, &claim)
		if created == nil {
			if uerr := r.updateStatus(ctx, &claim, orig); uerr != nil && err == nil {
				err = uerr
			}
			return res, err
		}
		sb = *created
	case err != nil:
		return ctrl.Result{}, err
	}
	if !metav1.IsControlledBy(&sb, &claim) {
		r.setCondition(&claim, v1.ConditionReady, metav1.ConditionFalse, ReasonNameTaken,
			fmt.Sprintf("a Sandbox named %s exists and is not this claim's", sb.Name))
		return ctrl.Result{RequeueAfter: time.Minute}, r.updateStatus(ctx, &claim, orig)
	}

	claim.Status.Sandbox = v1.ClaimedSandbox{
		Name:      sb.Name,
		NodeName:  sb.Status.NodeName,
		SandboxID: sb.Status.SandboxID,
		Endpoint:  sb.Status.Endpoint,
	}
	if sb.Status.Phase == v1.SandboxRunning {
		r.setCondition(&claim, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked,
			fmt.Sprintf("Sandbox %s runs as %s on node %s", sb.Name, sb.Status.SandboxID, sb.Status.NodeName))
	} else {
		reason, msg := "SandboxNotReady", fmt.Sprintf("Sandbox %s is %s", sb.Name, phaseOrPending(sb.Status.Phase))
		if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
			reason, msg = c.Reason, msg+": "+c.Message
		} else if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionPlaced); c != nil && c.Status == metav1.ConditionFalse {
			reason, msg = c.Reason, msg+": "+c.Message
		}
		r.setCondition(&claim, v1.ConditionReady, metav1.ConditionFalse, reason, msg)
	}
	return ctrl.Result{}, r.updateStatus(ctx, &claim, orig)
}

func phaseOrPending(p v1.SandboxPhase) v1.SandboxPhase {
	if p == "" {
		return v1.SandboxPending
	}
	return p
}

// create makes the claim's Sandbox from its template. A nil Sandbox means
// it could not (the claim's conditions say why).
func (r *ClaimReconciler) create(ctx context.Context, claim *v1.SandboxClaim) (*v1.Sandbox, ctrl.Result, error) {
	var tmpl v1.SandboxTemplate
	tn := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}
	if err := r.Client.Get(ctx, tn, &tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, ReasonTemplateNotFound,
				fmt.Sprintf("SandboxTemplate %s not found", tn.Name))
			return nil, ctrl.Result{RequeueAfter: 30 * time.Second}, nil
		}
		return nil, ctrl.Result{}, err
	}
	sb := &v1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Name:      claim.Name,
			Namespace: claim.Namespace,
			Labels:    map[string]string{LabelClaim: claim.Name, LabelTemplate: tmpl.Name},
		},
		Spec: v1.SandboxSpec{SandboxBlueprint: *tmpl.Spec.SandboxBlueprint.DeepCopy()},
	}
	switch {
	case claim.Spec.Lifecycle != nil:
		sb.Spec.Lifecycle = claim.Spec.Lifecycle.DeepCopy()
	case tmpl.Spec.Lifecycle != nil:
		sb.Spec.Lifecycle = tmpl.Spec.Lifecycle.DeepCopy()
	}
	if err := controllerutil.SetControllerReference(claim, sb, r.Scheme); err != nil {
		return nil, ctrl.Result{}, err
	}
	if err := r.Client.Create(ctx, sb); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, ctrl.Result{}, err
		}
		// Created by an earlier reconcile whose status write was lost.
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
			return nil, ctrl.Result{}, err
		}
	}
	return sb, ctrl.Result{}, nil
}

func (r *ClaimReconciler) setCondition(c *v1.SandboxClaim, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: c.Generation,
	})
}

// updateStatus writes the claim's status if it changed.
func (r *ClaimReconciler) updateStatus(ctx context.Context, c *v1.SandboxClaim, orig *v1.SandboxClaimStatus) error {
	if equalClaimStatus(&c.Status, orig) {
		return nil
	}
	return r.Client.Status().Update(ctx, c)
}

// equalClaimStatus compares two statuses, ignoring condition times
// (SetStatusCondition keeps a condition's time while its status holds).
func equalClaimStatus(a, b *v1.SandboxClaimStatus) bool {
	if a.Sandbox != b.Sandbox || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}
