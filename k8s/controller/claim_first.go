package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// firstStatusWait is how long a claim whose new Sandbox has no news yet
// waits before it writes a status saying so. A fork from a warm node is
// tens of milliseconds: in that time the Sandbox's Running status comes
// and the claim's first write says Ready, one write where there were two
// (and a conflict when the second reconcile read a cache without the
// first). A fork that takes longer is shown as pending after this.
const firstStatusWait = time.Second

// newSandboxes remembers, per claim, the Sandbox its reconciler created
// and when, until the claim's status is written (then the claim's
// ownWrites take over). While remembered:
//   - the claim's status write waits (firstStatusWait) for the Sandbox's
//     own news, a status its reconciler writes (Running, or why not);
//   - the claim binds that Sandbox and no other, whatever a cache behind
//     the create shows (the claim's status, which guarded that, is not
//     written yet); deleted meanwhile, the claim is over (SandboxGone),
//     as when a Sandbox its status names is gone.
//
// After a controller restart nothing is remembered: the cache, listed at
// start, shows the Sandbox, and the claim's status is written at once.
type newSandboxes struct {
	mu sync.Mutex
	m  map[types.NamespacedName]createdSandbox
}

type createdSandbox struct {
	claim   types.UID
	name    string
	created time.Time
	// pool is the claim's WarmPool condition as the create set it (why
	// it forked): only the reconcile that binds sets it.
	pool *metav1.Condition
}

// created records that claim's Sandbox name was created at now, and the
// claim's WarmPool condition then.
func (n *newSandboxes) created(claim *v1.SandboxClaim, name string, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = make(map[types.NamespacedName]createdSandbox)
	}
	rec := createdSandbox{claim: claim.UID, name: name, created: now}
	if c := meta.FindStatusCondition(claim.Status.Conditions, ConditionWarmPool); c != nil {
		rec.pool = c.DeepCopy()
	}
	n.m[client.ObjectKeyFromObject(claim)] = rec
}

// carryConditions gives a claim not yet showing it the WarmPool condition
// its create set, for the status write a later reconcile makes.
func (n *newSandboxes) carryConditions(claim *v1.SandboxClaim) {
	rec, ok := n.lookup(claim)
	if ok && rec.pool != nil && meta.FindStatusCondition(claim.Status.Conditions, ConditionWarmPool) == nil {
		meta.SetStatusCondition(&claim.Status.Conditions, *rec.pool)
	}
}

// lookup returns the Sandbox created for this claim (this object, not an
// earlier one of its name), if one is remembered.
func (n *newSandboxes) lookup(claim *v1.SandboxClaim) (createdSandbox, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec, ok := n.m[client.ObjectKeyFromObject(claim)]
	return rec, ok && rec.claim == claim.UID
}

// holdStatus is how much longer the claim's first status waits for its
// new Sandbox's news: zero when the Sandbox has some (a phase or a
// condition), when none is remembered, or when the wait is over.
func (n *newSandboxes) holdStatus(claim *v1.SandboxClaim, sb *v1.Sandbox, now time.Time) time.Duration {
	if sb.Status.Phase != "" || len(sb.Status.Conditions) > 0 {
		return 0
	}
	rec, ok := n.lookup(claim)
	if !ok || rec.name != sb.Name {
		return 0
	}
	return max(0, firstStatusWait-now.Sub(rec.created))
}

// forget ends the record of a claim whose status is written, or that is
// gone.
func (n *newSandboxes) forget(nn types.NamespacedName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.m, nn)
}

// len is how many claims are remembered (tests).
func (n *newSandboxes) len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.m)
}
