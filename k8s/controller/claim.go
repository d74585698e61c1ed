package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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

// Labels on the Sandboxes of claims and pools. A pool's unclaimed
// Sandboxes carry LabelPool (its name: the pool's selector); a claim's,
// LabelClaim; both, LabelTemplate. Taking a Sandbox from a pool swaps
// LabelPool for LabelClaim.
const (
	LabelClaim    = "forkd.dev/claim"
	LabelPool     = "forkd.dev/pool"
	LabelTemplate = "forkd.dev/template"
	// LabelTemplateHash is on a pool's Sandboxes: the TemplateHash of
	// the template's spec they were forked from.
	LabelTemplateHash = "forkd.dev/template-hash"
)

// Claim condition types and reasons.
const (
	ReasonTemplateNotFound = "TemplateNotFound"
	// Warm pool Ready reasons (besides TemplateNotFound).
	ReasonRollingOut = "RollingOut"
	ReasonFilling    = "Filling"
	ReasonPoolReady  = "Ready"
	// ReasonCreated: the claim created its Sandbox (an event).
	ReasonCreated     = "Created"
	ReasonSandboxGone = "SandboxGone"
	ReasonNameTaken   = "NameTaken"
	// ReasonSandboxLost: the claim's Sandbox was lost with its node and
	// lostPolicy is Fail.
	ReasonSandboxLost = "SandboxLost"
	// ConditionReplacing is True while the claim replaces a Sandbox lost
	// with its node by a new one (status.sandbox.name) that may not exist
	// yet; False, reason Replaced, once it does (until the next loss).
	ConditionReplacing = "Replacing"
	// ReasonReplacing: Ready is False while the replacement is made.
	ReasonReplacing = "Replacing"
	// ReasonReplaced: the replacement exists.
	ReasonReplaced = "Replaced"

	// ConditionWarmPool says where the claim's Sandbox came from: True,
	// taken from a pool; False, forked (with why none was taken).
	ConditionWarmPool = "WarmPool"
	// ReasonTakenFromPool: the claim took a ready Sandbox of a pool.
	ReasonTakenFromPool = "TakenFromPool"
	// ReasonNoneReady: its pools had no ready Sandbox for it; it forked.
	ReasonNoneReady = "NoneReady"
	// ReasonNoPool: no pool of its template in its namespace; it forked.
	ReasonNoPool = "NoPool"
	// ReasonPoolNotFound: warmPoolRef names no pool; it forked.
	ReasonPoolNotFound = "PoolNotFound"
	// ReasonPoolTemplateMismatch: warmPoolRef's pool forks another
	// template; it forked.
	ReasonPoolTemplateMismatch = "PoolTemplateMismatch"
)

// ClaimReconciler binds each SandboxClaim to a Sandbox it controls (so
// deleting the claim deletes the Sandbox, and the Sandbox's finalizer its
// microVM): a Running one taken from a warm pool (warmPoolRef, else any
// pool of the claim's template in its namespace) when one is ready, else
// one it creates, named as the claim, from its template with the claim's
// lifecycle over the template's. Then it copies the Sandbox's node, id and
// endpoint into the claim's status and mirrors its readiness.
//
// A Sandbox lost with its node is replaced under lostPolicy Replace: a new
// Sandbox, named claimName-rN, freshly forked where placement finds room
// (the lost node is out of placement), and the lost one deleted (its
// finalizer asks nothing of a lost node). Under Fail the claim stays
// Ready False, reason SandboxLost.
type ClaimReconciler struct {
	Client client.Client
	// Reader, when set, reads the claim itself before it binds a Sandbox
	// (the manager's API reader): a cache that has not yet seen the
	// claim's status name a Sandbox must not make it take a second.
	Reader client.Reader
	Scheme *runtime.Scheme
	// Preplacer, when set, binds a Sandbox to a node before it is created
	// (SandboxReconciler.Preplace), which saves its fork a status write.
	Preplacer Preplacer
	// Events records which Sandbox a claim binds, and its losses.
	Events EventRecorder
	Log    logr.Logger
	// Now is the clock (tests set it).
	Now func() time.Time

	// created are the Sandboxes made for claims whose status does not
	// name them yet; writes, the Sandbox each claim's last status write
	// named, until the cache shows it.
	created newSandboxes
	writes  ownWrites[string]
}

func (r *ClaimReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Preplacer places a Sandbox about to be created (see
// SandboxReconciler.Preplace).
type Preplacer interface {
	Preplace(sb *v1.Sandbox) (created func(error))
}

// Preplace is p.Preplace(sb), or nothing to do when p is nil.
func Preplace(p Preplacer, sb *v1.Sandbox) (created func(error)) {
	if p == nil {
		return func(error) {}
	}
	return p.Preplace(sb)
}

// Reconcile binds one claim.
func (r *ClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var claim v1.SandboxClaim
	err := r.Client.Get(ctx, req.NamespacedName, &claim)
	if err == nil && r.Reader != nil && r.writes.behind(req.NamespacedName, claim.UID, claim.Status.Sandbox.Name) {
		// The cache is behind this reconciler's own status write: what
		// the claim is bound to is read past it, not decided again.
		if err = r.Reader.Get(ctx, req.NamespacedName, &claim); err == nil {
			r.writes.settle(req.NamespacedName, claim.UID, claim.Status.Sandbox.Name)
		}
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !claim.DeletionTimestamp.IsZero() {
		r.forget(req.NamespacedName)
		return ctrl.Result{}, nil // the owner reference takes the Sandbox
	}
	orig := claim.Status.DeepCopy()
	sb, res, err := r.boundSandbox(ctx, &claim)
	if sb == nil {
		if uerr := r.updateStatus(ctx, &claim, orig); uerr != nil && err == nil {
			err = uerr
		}
		return res, err
	}
	if !metav1.IsControlledBy(sb, &claim) {
		r.setCondition(&claim, v1.ConditionReady, metav1.ConditionFalse, ReasonNameTaken,
			fmt.Sprintf("a Sandbox named %s exists and is not this claim's", sb.Name))
		return ctrl.Result{RequeueAfter: time.Minute}, r.updateStatus(ctx, &claim, orig)
	}
	if sb.Status.Phase == v1.SandboxLost {
		return r.lost(ctx, &claim, sb, orig)
	}
	r.mirror(&claim, sb)
	if orig.Sandbox.Name == "" {
		r.created.carryConditions(&claim)
		r.poolConditionOf(ctx, &claim, sb)
		if hold := r.created.holdStatus(&claim, sb, r.now()); hold > 0 {
			// Its fork is under way; its Running status (or why not)
			// brings the claim back, else this does.
			return ctrl.Result{RequeueAfter: hold}, nil
		}
	}
	return ctrl.Result{}, r.updateStatus(ctx, &claim, orig)
}

// forget ends what is remembered of a claim that is gone.
func (r *ClaimReconciler) forget(nn types.NamespacedName) {
	r.created.forget(nn)
	r.writes.forget(nn)
}

// boundSandbox returns the claim's Sandbox: the one its status names,
// else one it already controls, else one taken from a pool, else a new
// one. A nil Sandbox means there is none now (the conditions say why).
func (r *ClaimReconciler) boundSandbox(ctx context.Context, claim *v1.SandboxClaim) (*v1.Sandbox, ctrl.Result, error) {
	name := claim.Status.Sandbox.Name
	if name == "" {
		return r.bind(ctx, claim)
	}
	if replacing(claim) {
		if err := r.deleteLost(ctx, claim, name); err != nil {
			return nil, ctrl.Result{}, err
		}
	}
	var sb v1.Sandbox
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: name}, &sb)
	switch {
	case replacing(claim) && apierrors.IsNotFound(err):
		created, res, err := r.create(ctx, claim, name)
		if created != nil {
			r.replaced(claim)
		}
		return created, res, err
	case apierrors.IsNotFound(err):
		// Bound once, now gone (shutdownPolicy Delete, or deleted by
		// hand): the claim is over; it does not fork again.
		r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, ReasonSandboxGone,
			fmt.Sprintf("Sandbox %s no longer exists", name))
		return nil, ctrl.Result{}, nil
	case err != nil:
		return nil, ctrl.Result{}, err
	}
	if replacing(claim) {
		r.replaced(claim)
	}
	return &sb, ctrl.Result{}, nil
}

// bind finds or makes the Sandbox of a claim that has none in its status.
func (r *ClaimReconciler) bind(ctx context.Context, claim *v1.SandboxClaim) (*v1.Sandbox, ctrl.Result, error) {
	// Taken or created by an earlier reconcile whose status write was
	// lost, or which the cached claim does not show yet.
	mine, err := r.ownSandboxes(ctx, claim, r.Client)
	if err != nil {
		return nil, ctrl.Result{}, err
	}
	for _, sb := range mine {
		if live(sb.Status.Phase) {
			return sb, ctrl.Result{}, nil
		}
	}
	if len(mine) > 0 {
		return mine[0], ctrl.Result{}, nil
	}
	if rec, ok := r.created.lookup(claim); ok {
		// Made by an earlier reconcile, not in the cache yet, and not
		// named in the claim's status, which waits for its news.
		var sb v1.Sandbox
		err := r.reader().Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: rec.name}, &sb)
		if err == nil {
			return &sb, ctrl.Result{}, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, ctrl.Result{}, err
		}
		// Deleted since, before the claim's status named it: as for a
		// bound Sandbox gone (boundSandbox), the claim is over.
		claim.Status.Sandbox.Name = rec.name
		r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, ReasonSandboxGone,
			fmt.Sprintf("Sandbox %s no longer exists", rec.name))
		return nil, ctrl.Result{}, nil
	}
	// The cache may be behind the claim's own status, an earlier
	// reconcile's write naming the Sandbox it took or made (or behind a
	// create whose claim status waits: r.created, above). Creating is
	// safe anyway: the Sandbox is named as the claim, so a second Create
	// finds the first (AlreadyExists). Taking from a pool is not: before
	// it takes, takeFromPool reads the claim past the cache (one GET, on
	// the pool's path only).
	sb, err := r.takeFromPool(ctx, claim)
	if errors.Is(err, errBoundPastCache) {
		// The claim's status event brings the cache up; this is a fallback.
		return nil, ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if sb != nil || err != nil {
		return sb, ctrl.Result{}, err
	}
	made, res, err := r.create(ctx, claim, claim.Name)
	if made != nil {
		r.created.created(claim, made.Name, r.now())
	}
	return made, res, err
}

func (r *ClaimReconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

// ownSandboxes lists the Sandboxes labelled with the claim and controlled
// by it, not being deleted, by name.
func (r *ClaimReconciler) ownSandboxes(ctx context.Context, claim *v1.SandboxClaim, rd client.Reader) ([]*v1.Sandbox, error) {
	var list v1.SandboxList
	if err := rd.List(ctx, &list, client.InNamespace(claim.Namespace), client.MatchingLabels{LabelClaim: claim.Name}); err != nil {
		return nil, err
	}
	var out []*v1.Sandbox
	for i := range list.Items {
		sb := &list.Items[i]
		if metav1.IsControlledBy(sb, claim) && sb.DeletionTimestamp.IsZero() {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *v1.Sandbox) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// mirror copies where the Sandbox runs into the claim and its readiness
// into the claim's Ready condition.
func (r *ClaimReconciler) mirror(claim *v1.SandboxClaim, sb *v1.Sandbox) {
	claim.Status.Sandbox = v1.ClaimedSandbox{
		Name:      sb.Name,
		NodeName:  sb.Status.NodeName,
		SandboxID: sb.Status.SandboxID,
		Endpoint:  sb.Status.Endpoint,
	}
	if sb.Status.Phase == v1.SandboxRunning {
		r.setCondition(claim, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked,
			fmt.Sprintf("Sandbox %s runs as %s on node %s", sb.Name, sb.Status.SandboxID, sb.Status.NodeName))
		return
	}
	reason, msg := "SandboxNotReady", fmt.Sprintf("Sandbox %s is %s", sb.Name, phaseOrPending(sb.Status.Phase))
	if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		reason, msg = c.Reason, msg+": "+c.Message
	} else if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionPlaced); c != nil && c.Status == metav1.ConditionFalse {
		reason, msg = c.Reason, msg+": "+c.Message
	}
	r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, reason, msg)
}

func phaseOrPending(p v1.SandboxPhase) v1.SandboxPhase {
	if p == "" {
		return v1.SandboxPending
	}
	return p
}

// create makes the claim's Sandbox, named name, from its template. A nil
// Sandbox means it could not (the claim's conditions say why).
func (r *ClaimReconciler) create(ctx context.Context, claim *v1.SandboxClaim, name string) (*v1.Sandbox, ctrl.Result, error) {
	var tmpl v1.SandboxTemplate
	tn := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}
	if err := r.Client.Get(ctx, tn, &tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			r.setCondition(claim, v1.ConditionReady, metav1.ConditionFalse, ReasonTemplateNotFound,
				fmt.Sprintf("SandboxTemplate %s not found", tn.Name))
			return nil, ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return nil, ctrl.Result{}, err
	}
	sb := sandboxFromTemplate(&tmpl, claim.Spec.Lifecycle)
	sb.Name, sb.Namespace = name, claim.Namespace
	sb.Labels = map[string]string{LabelClaim: claim.Name, LabelTemplate: tmpl.Name}
	if err := controllerutil.SetControllerReference(claim, sb, r.Scheme); err != nil {
		return nil, ctrl.Result{}, err
	}
	// With its finalizer, so its reconcile has no write to make for it.
	controllerutil.AddFinalizer(sb, Finalizer)
	created := Preplace(r.Preplacer, sb)
	err := r.Client.Create(ctx, sb)
	created(err)
	switch {
	case err == nil:
		record(r.Events, claim, sb, eventNormal, ReasonCreated, actionBind, "created Sandbox %s from SandboxTemplate %s", sb.Name, tmpl.Name)
	case !apierrors.IsAlreadyExists(err):
		return nil, ctrl.Result{}, err
	default:
		// Created by an earlier reconcile whose status write was lost or
		// that the cache does not show yet (or someone else's: Reconcile
		// checks the owner); read past the cache, which may not have it.
		if err := r.reader().Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
			return nil, ctrl.Result{}, err
		}
	}
	return sb, ctrl.Result{}, nil
}

// sandboxFromTemplate is a Sandbox of the template's blueprint with lc as
// its lifecycle, else the template's; the caller names and labels it.
func sandboxFromTemplate(tmpl *v1.SandboxTemplate, lc *v1.Lifecycle) *v1.Sandbox {
	sb := &v1.Sandbox{Spec: v1.SandboxSpec{SandboxBlueprint: *tmpl.Spec.SandboxBlueprint.DeepCopy()}}
	switch {
	case lc != nil:
		sb.Spec.Lifecycle = lc.DeepCopy()
	case tmpl.Spec.Lifecycle != nil:
		sb.Spec.Lifecycle = tmpl.Spec.Lifecycle.DeepCopy()
	}
	return sb
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
	if err := r.Client.Status().Update(ctx, c); err != nil {
		return err
	}
	nn := client.ObjectKeyFromObject(c)
	r.writes.wrote(nn, c.UID, c.Status.Sandbox.Name)
	r.created.forget(nn) // its status is written: no first write to hold
	return nil
}

// equalClaimStatus compares two statuses, ignoring condition times
// (SetStatusCondition keeps a condition's time while its status holds).
func equalClaimStatus(a, b *v1.SandboxClaimStatus) bool {
	return a.Sandbox == b.Sandbox && a.Replacements == b.Replacements && equalConditions(a.Conditions, b.Conditions)
}

// equalConditions compares conditions, ignoring their times.
func equalConditions(a, b []metav1.Condition) bool {
	return slices.EqualFunc(a, b, func(x, y metav1.Condition) bool {
		return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message && x.ObservedGeneration == y.ObservedGeneration
	})
}
