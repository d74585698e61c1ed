package controller

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// WarmPoolReconciler keeps each SandboxWarmPool's spec.replicas unclaimed
// Sandboxes of its template: owned by the pool (controller reference) and
// labelled LabelPool and LabelTemplate, forked by the Sandbox reconciler
// like any other. It creates the missing ones, deletes the surplus (those
// not Running first) and the dead ones (Lost, Ended: the pool forks
// others), and reports status.replicas (its live Sandboxes),
// readyReplicas (those Running) and the scale subresource's selector.
//
// A claim takes a Sandbox by moving its controller reference from the
// pool to itself and its label from LabelPool to LabelClaim, in one
// optimistic-concurrency Update (ClaimReconciler.takeFromPool); the pool,
// woken by that update, forks a replacement. So a pool's Sandboxes are
// exactly those it controls, and a pool deleted (by the garbage collector
// in a cluster, or by this reconciler when it finds the pool gone) takes
// only its unclaimed Sandboxes with it.
type WarmPoolReconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	Log    logr.Logger

	// created are Sandboxes this reconciler created that its reads have
	// not shown yet: counted as the pool's, so a cache behind its own
	// writes does not make it fork twice.
	created expectations
}

// expectTTL is how long a created Sandbox counts before a read shows it.
const expectTTL = time.Minute

// Reconcile brings one pool to its replicas of its template as it is now
// (see rollout).
func (r *WarmPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pool v1.SandboxWarmPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		// Gone: delete what it left unclaimed (the garbage collector does
		// the same in a cluster; the fake client has none).
		r.created.forget(req.NamespacedName)
		return ctrl.Result{}, r.deleteOrphans(ctx, req.NamespacedName)
	}
	owned, err := r.poolSandboxes(ctx, &pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		r.created.forget(req.NamespacedName)
		return ctrl.Result{}, r.deleteAll(ctx, owned)
	}

	var alive, dead []*v1.Sandbox
	for _, sb := range owned {
		switch {
		case !sb.DeletionTimestamp.IsZero():
		case live(sb.Status.Phase):
			alive = append(alive, sb)
		default:
			dead = append(dead, sb)
		}
	}
	if err := r.deleteAll(ctx, dead); err != nil {
		return ctrl.Result{}, err
	}
	st := pool.Status.DeepCopy()
	var tmpl v1.SandboxTemplate
	tn := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}
	if err := r.Client.Get(ctx, tn, &tmpl); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		// Its Sandboxes stay (claims may take them); it forks no more.
		st.Replicas, st.ReadyReplicas, st.UpdatedReplicas = countPool(alive, st.TemplateHash)
		r.setCondition(&pool, st, metav1.ConditionFalse, ReasonTemplateNotFound,
			fmt.Sprintf("SandboxTemplate %s not found: the pool forks no more sandboxes until it exists", tn.Name))
		return ctrl.Result{RequeueAfter: 30 * time.Second}, r.updateStatus(ctx, &pool, st)
	}
	hash := TemplateHash(&tmpl)
	var current, outdated []*v1.Sandbox
	for _, sb := range alive {
		switch {
		case sb.Labels[LabelTemplateHash] == hash:
			current = append(current, sb)
		case sb.Labels[LabelTemplateHash] == "" && pool.Status.TemplateHash == "":
			// Forked before pools hashed their template (an upgrade):
			// taken as the template's current spec, and labelled so.
			if err := r.adopt(ctx, sb, hash); err != nil {
				return ctrl.Result{}, err
			}
			current = append(current, sb)
		default:
			outdated = append(outdated, sb)
		}
	}
	pending := r.created.pending(req.NamespacedName, func(name string) bool {
		return slices.ContainsFunc(owned, func(sb *v1.Sandbox) bool { return sb.Name == name }) || r.noLongerPooled(ctx, &pool, name)
	})

	want := int(pool.Spec.Replicas)
	switch have := len(current) + pending; {
	case have < want:
		var made []*v1.Sandbox
		made, err = r.fill(ctx, &pool, &tmpl, hash, want-have)
		current = append(current, made...)
	case have > want && len(current) > 0:
		n := min(have-want, len(current))
		sortSurplusFirst(current)
		err = r.deleteAll(ctx, current[:n])
		current = current[n:]
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if outdated, err = r.rollout(ctx, want, current, outdated); err != nil {
		return ctrl.Result{}, err
	}

	st.TemplateHash = hash
	st.Replicas, st.ReadyReplicas, st.UpdatedReplicas = countPool(append(current, outdated...), hash)
	switch {
	case len(outdated) > 0:
		r.setCondition(&pool, st, metav1.ConditionFalse, ReasonRollingOut,
			fmt.Sprintf("%d of %d sandboxes fork SandboxTemplate %s as it is now; the %d others go as new ones run",
				st.UpdatedReplicas, st.Replicas, tmpl.Name, len(outdated)))
	case int(st.ReadyReplicas) < want:
		r.setCondition(&pool, st, metav1.ConditionFalse, ReasonFilling,
			fmt.Sprintf("%d of %d sandboxes Running", st.ReadyReplicas, want))
	default:
		r.setCondition(&pool, st, metav1.ConditionTrue, ReasonPoolReady,
			fmt.Sprintf("%d sandboxes of SandboxTemplate %s Running", st.ReadyReplicas, tmpl.Name))
	}
	return ctrl.Result{}, r.updateStatus(ctx, &pool, st)
}

// adopt labels a Sandbox of the pool with hash (a merge patch of its
// labels alone).
func (r *WarmPoolReconciler) adopt(ctx context.Context, sb *v1.Sandbox, hash string) error {
	before := sb.DeepCopy()
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	sb.Labels[LabelTemplateHash] = hash
	if err := r.Client.Patch(ctx, sb, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("warm pool: labelling Sandbox %s with its template's hash: %w", sb.Name, err)
	}
	return nil
}

// rollout deletes outdated Sandboxes (forked from an earlier spec of the
// template) as the current ones run: those not Running at once, Running
// ones only while Running ones of either kind exceed want, so a pool
// keeps serving claims through a template change. When a current one
// cannot be placed for want of room, one Running outdated one goes
// anyway, to make room (a Deployment's maxUnavailable of 1): otherwise a
// full cluster would hold the rollout for ever. It returns the outdated
// ones left.
func (r *WarmPoolReconciler) rollout(ctx context.Context, want int, current, outdated []*v1.Sandbox) ([]*v1.Sandbox, error) {
	_, runCurrent, _ := countPool(current, "")
	_, runOutdated, _ := countPool(outdated, "")
	sortSurplusFirst(outdated)
	n := len(outdated) - int(runOutdated) // not Running: sorted first
	if excess := int(runCurrent+runOutdated) - want; excess > 0 {
		n += min(excess, int(runOutdated))
	} else if runOutdated > 0 && slices.ContainsFunc(current, noRoom) {
		n++
	}
	if err := r.deleteAll(ctx, outdated[:n]); err != nil {
		return outdated, err
	}
	return outdated[n:], nil
}

// noRoom says placement found no room for a Sandbox.
func noRoom(sb *v1.Sandbox) bool {
	c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionPlaced)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonNoCapacity
}

// sortSurplusFirst orders Sandboxes as the surplus goes: not Running
// first, then by name, descending (the same choice every time, so a stale
// read deletes nothing twice).
func sortSurplusFirst(sbs []*v1.Sandbox) {
	slices.SortFunc(sbs, func(a, b *v1.Sandbox) int {
		if ra, rb := a.Status.Phase == v1.SandboxRunning, b.Status.Phase == v1.SandboxRunning; ra != rb {
			if ra {
				return 1
			}
			return -1
		}
		return cmp.Compare(b.Name, a.Name)
	})
}

// countPool counts live Sandboxes, those Running, and those of hash.
func countPool(sbs []*v1.Sandbox, hash string) (replicas, ready, updated int32) {
	for _, sb := range sbs {
		replicas++
		if sb.Status.Phase == v1.SandboxRunning {
			ready++
		}
		if hash != "" && sb.Labels[LabelTemplateHash] == hash {
			updated++
		}
	}
	return replicas, ready, updated
}

// TemplateHash identifies a template's spec: what a pool's Sandboxes are
// forked from, compared to roll a changed template out (as a Deployment's
// pod-template-hash).
func TemplateHash(tmpl *v1.SandboxTemplate) string {
	b, _ := json.Marshal(tmpl.Spec)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:5])
}

// poolsOfTemplate maps a SandboxTemplate to the pools in its namespace
// that fork it.
func (r *WarmPoolReconciler) poolsOfTemplate(ctx context.Context, o client.Object) []reconcile.Request {
	var pools v1.SandboxWarmPoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(o.GetNamespace())); err != nil {
		r.Log.Error(err, "listing the warm pools of a template", "template", o.GetName())
		return nil
	}
	var out []reconcile.Request
	for _, p := range pools.Items {
		if p.Spec.TemplateRef.Name == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
		}
	}
	return out
}

// poolSandboxes lists the Sandboxes labelled with the pool and controlled
// by it (a Sandbox a claim took has neither).
func (r *WarmPoolReconciler) poolSandboxes(ctx context.Context, pool *v1.SandboxWarmPool) ([]*v1.Sandbox, error) {
	var list v1.SandboxList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{LabelPool: pool.Name}); err != nil {
		return nil, err
	}
	var out []*v1.Sandbox
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], pool) {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// noLongerPooled says a Sandbox the pool created is readable and no
// longer the pool's: a claim took it before a list showed it.
func (r *WarmPoolReconciler) noLongerPooled(ctx context.Context, pool *v1.SandboxWarmPool, name string) bool {
	var sb v1.Sandbox
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: name}, &sb); err != nil {
		return false
	}
	return !metav1.IsControlledBy(&sb, pool)
}

// fill creates n Sandboxes from the pool's template, whose spec hashes
// to hash, and returns those it created.
func (r *WarmPoolReconciler) fill(ctx context.Context, pool *v1.SandboxWarmPool, tmpl *v1.SandboxTemplate, hash string, n int) ([]*v1.Sandbox, error) {
	key := client.ObjectKeyFromObject(pool)
	var made []*v1.Sandbox
	for range n {
		sb := sandboxFromTemplate(tmpl, nil)
		sb.Namespace = pool.Namespace
		sb.GenerateName = pool.Name + "-"
		sb.Labels = map[string]string{LabelPool: pool.Name, LabelTemplate: tmpl.Name, LabelTemplateHash: hash}
		if err := controllerutil.SetControllerReference(pool, sb, r.Scheme); err != nil {
			return made, err
		}
		controllerutil.AddFinalizer(sb, Finalizer)
		if err := r.Client.Create(ctx, sb); err != nil {
			return made, fmt.Errorf("warm pool %s: creating a Sandbox: %w", key, err)
		}
		r.created.add(key, sb.Name)
		made = append(made, sb)
	}
	return made, nil
}

// deleteAll deletes Sandboxes as they were read: a Sandbox changed since
// (a claim took it) is left alone, and the next reconcile looks again.
func (r *WarmPoolReconciler) deleteAll(ctx context.Context, sbs []*v1.Sandbox) error {
	for _, sb := range sbs {
		if !sb.DeletionTimestamp.IsZero() {
			continue
		}
		rv := sb.ResourceVersion
		err := r.Client.Delete(ctx, sb, client.Preconditions{ResourceVersion: &rv})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

// deleteOrphans deletes the unclaimed Sandboxes of a pool that is gone:
// those still labelled with it and controlled by a SandboxWarmPool of its
// name.
func (r *WarmPoolReconciler) deleteOrphans(ctx context.Context, pool types.NamespacedName) error {
	var list v1.SandboxList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{LabelPool: pool.Name}); err != nil {
		return err
	}
	var orphans []*v1.Sandbox
	for i := range list.Items {
		ref := metav1.GetControllerOf(&list.Items[i])
		if ref != nil && ref.Kind == "SandboxWarmPool" && ref.Name == pool.Name && ref.APIVersion == v1.GroupVersion.String() {
			orphans = append(orphans, &list.Items[i])
		}
	}
	return r.deleteAll(ctx, orphans)
}

// setCondition sets the pool's Ready condition in st.
func (r *WarmPoolReconciler) setCondition(pool *v1.SandboxWarmPool, st *v1.SandboxWarmPoolStatus, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: pool.Generation,
	})
}

// updateStatus writes st, with the selector, if it differs from the
// pool's (condition times aside).
func (r *WarmPoolReconciler) updateStatus(ctx context.Context, pool *v1.SandboxWarmPool, st *v1.SandboxWarmPoolStatus) error {
	st.Selector = labels.SelectorFromSet(labels.Set{LabelPool: pool.Name}).String()
	old := pool.Status
	if old.Replicas == st.Replicas && old.ReadyReplicas == st.ReadyReplicas && old.UpdatedReplicas == st.UpdatedReplicas &&
		old.Selector == st.Selector && old.TemplateHash == st.TemplateHash && equalConditions(old.Conditions, st.Conditions) {
		return nil
	}
	pool.Status = *st
	return r.Client.Status().Update(ctx, pool)
}

// expectations are, per pool, the Sandboxes created and not yet seen.
type expectations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]map[string]time.Time
}

func (x *expectations) add(pool types.NamespacedName, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		x.m = map[types.NamespacedName]map[string]time.Time{}
	}
	if x.m[pool] == nil {
		x.m[pool] = map[string]time.Time{}
	}
	x.m[pool][name] = time.Now().Add(expectTTL)
}

// pending drops the names seen, and those older than expectTTL, and
// returns how many are left.
func (x *expectations) pending(pool types.NamespacedName, seen func(name string) bool) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	now := time.Now()
	for name, deadline := range x.m[pool] {
		if now.After(deadline) || seen(name) {
			delete(x.m[pool], name)
		}
	}
	return len(x.m[pool])
}

func (x *expectations) forget(pool types.NamespacedName) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.m, pool)
}
