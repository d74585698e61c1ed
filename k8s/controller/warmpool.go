package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

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

// Reconcile brings one pool to its replicas.
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
	pending := r.created.pending(req.NamespacedName, func(name string) bool {
		return slices.ContainsFunc(owned, func(sb *v1.Sandbox) bool { return sb.Name == name }) || r.noLongerPooled(ctx, &pool, name)
	})

	var res ctrl.Result
	want := int(pool.Spec.Replicas)
	switch have := len(alive) + pending; {
	case have < want:
		res, err = r.fill(ctx, &pool, want-have)
	case have > want && len(alive) > 0:
		// The surplus goes not-Running first, then by name (the same
		// choice every time, so a stale read deletes nothing twice).
		slices.SortFunc(alive, func(a, b *v1.Sandbox) int {
			if ra, rb := a.Status.Phase == v1.SandboxRunning, b.Status.Phase == v1.SandboxRunning; ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return cmp.Compare(b.Name, a.Name)
		})
		n := min(have-want, len(alive))
		err = r.deleteAll(ctx, alive[:n])
		alive = alive[n:]
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if uerr := r.updateStatus(ctx, &pool, alive); uerr != nil {
		return ctrl.Result{}, uerr
	}
	return res, nil
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

// fill creates n Sandboxes from the pool's template.
func (r *WarmPoolReconciler) fill(ctx context.Context, pool *v1.SandboxWarmPool, n int) (ctrl.Result, error) {
	var tmpl v1.SandboxTemplate
	tn := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}
	if err := r.Client.Get(ctx, tn, &tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			r.Log.Info("warm pool's template not found", "pool", pool.Name, "template", tn.Name)
			return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	key := client.ObjectKeyFromObject(pool)
	for range n {
		sb := sandboxFromTemplate(&tmpl, nil)
		sb.Namespace = pool.Namespace
		sb.GenerateName = pool.Name + "-"
		sb.Labels = map[string]string{LabelPool: pool.Name, LabelTemplate: tmpl.Name}
		if err := controllerutil.SetControllerReference(pool, sb, r.Scheme); err != nil {
			return ctrl.Result{}, err
		}
		controllerutil.AddFinalizer(sb, Finalizer)
		if err := r.Client.Create(ctx, sb); err != nil {
			return ctrl.Result{}, fmt.Errorf("warm pool %s: creating a Sandbox: %w", key, err)
		}
		r.created.add(key, sb.Name)
	}
	return ctrl.Result{}, nil
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

// updateStatus writes replicas, readyReplicas and the selector if changed.
func (r *WarmPoolReconciler) updateStatus(ctx context.Context, pool *v1.SandboxWarmPool, live []*v1.Sandbox) error {
	st := v1.SandboxWarmPoolStatus{
		Replicas: int32(len(live)),
		Selector: labels.SelectorFromSet(labels.Set{LabelPool: pool.Name}).String(),
	}
	for _, sb := range live {
		if sb.Status.Phase == v1.SandboxRunning {
			st.ReadyReplicas++
		}
	}
	if pool.Status == st {
		return nil
	}
	pool.Status = st
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
