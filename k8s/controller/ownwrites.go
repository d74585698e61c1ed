package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// ownWrites remembers, per object, what a reconciler last wrote into its
// status that matters for its next decision (P: for a Sandbox, its
// progress; for a claim, the Sandbox it names), until a cached copy shows
// it: the "expectations" Kubernetes' own controllers keep. A reconcile
// whose cached copy shows something else runs ahead of the cache (its
// own status event not in yet) and reads the object past the cache
// instead of deciding again; every other reconcile trusts the cache. So
// no decision path pays a read past the cache for a write that is not
// there.
//
// What it does not cover: a write whose answer was lost (the reconciler
// does not know it was made), or one made by another replica before this
// one led. For a Sandbox the fork's idempotency key covers those (a fork
// replayed gets the first one's sandbox back).
type ownWrites[P comparable] struct {
	mu sync.Mutex
	// m holds the last value written, by namespace/name.
	m map[types.NamespacedName]written[P]
}

type written[P comparable] struct {
	uid   types.UID
	value P
}

// wrote records a status write the apiserver accepted.
func (w *ownWrites[P]) wrote(nn types.NamespacedName, uid types.UID, value P) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = make(map[types.NamespacedName]written[P])
	}
	w.m[nn] = written[P]{uid: uid, value: value}
}

// behind says the cached copy (uid, showing cached) does not show the
// value last written for it. A copy that shows it, or is another object
// of the same name, ends the record.
func (w *ownWrites[P]) behind(nn types.NamespacedName, uid types.UID, cached P) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec, ok := w.m[nn]
	if !ok {
		return false
	}
	if rec.uid != uid || rec.value == cached {
		delete(w.m, nn)
		return false
	}
	return true
}

// settle compares the record with the apiserver's copy (read because the
// cache was behind): one that shows another value was written since by
// someone else, and the record, no longer the latest, ends. The record of
// a write the apiserver's copy shows stays until the cache shows it too.
func (w *ownWrites[P]) settle(nn types.NamespacedName, uid types.UID, fresh P) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec, ok := w.m[nn]; ok && (rec.uid != uid || rec.value != fresh) {
		delete(w.m, nn)
	}
}

// forget ends the record of an object that is gone.
func (w *ownWrites[P]) forget(nn types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, nn)
}

// len is how many records are kept (tests).
func (w *ownWrites[P]) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m)
}

// progress is what the Sandbox reconciler's decisions rest on: where the
// Sandbox was placed, what it was forked as, its phase.
type progress struct {
	node, id string
	phase    v1.SandboxPhase
}

func progressOf(sb *v1.Sandbox) progress {
	return progress{node: sb.Status.NodeName, id: sb.Status.SandboxID, phase: sb.Status.Phase}
}
