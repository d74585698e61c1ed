package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// ownWrites remembers, per Sandbox, the progress (node, sandbox ID,
// phase) the reconciler last wrote into its status, until a cached copy
// shows it: the "expectations" Kubernetes' own controllers keep. A
// reconcile whose cached copy shows other progress runs ahead of the
// cache (its own status event not in yet) and reads the Sandbox past the
// cache instead of placing or forking again; every other reconcile
// trusts the cache. So a fork's path has no read past the cache (it had
// one for every Sandbox not yet forked: 3-7 ms of a claim's ~45 here).
//
// What it does not cover, the idempotency key does: a write whose answer
// was lost (the reconciler does not know it was made), or one made by
// another replica before this one led. A fork replayed then gets the
// first fork's sandbox back.
type ownWrites struct {
	mu sync.Mutex
	// m holds the last progress written, by namespace/name.
	m map[types.NamespacedName]written
}

type written struct {
	uid      types.UID
	progress progress
}

type progress struct {
	node, id string
	phase    v1.SandboxPhase
}

func progressOf(sb *v1.Sandbox) progress {
	return progress{node: sb.Status.NodeName, id: sb.Status.SandboxID, phase: sb.Status.Phase}
}

// wrote records a status write the apiserver accepted.
func (w *ownWrites) wrote(sb *v1.Sandbox) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = make(map[types.NamespacedName]written)
	}
	w.m[types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}] = written{uid: sb.UID, progress: progressOf(sb)}
}

// behind says the cached copy sb does not show the progress last written
// for it. A copy that shows it, or is another object of the same name,
// ends the record.
func (w *ownWrites) behind(sb *v1.Sandbox) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	nn := types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}
	rec, ok := w.m[nn]
	if !ok {
		return false
	}
	if rec.uid != sb.UID || rec.progress == progressOf(sb) {
		delete(w.m, nn)
		return false
	}
	return true
}

// settle compares the record with the apiserver's copy (read because the
// cache was behind): one that shows other progress was written since by
// someone else, and the record, no longer the latest, ends. The record of
// a write the apiserver's copy shows stays until the cache shows it too.
func (w *ownWrites) settle(fresh *v1.Sandbox) {
	w.mu.Lock()
	defer w.mu.Unlock()
	nn := types.NamespacedName{Namespace: fresh.Namespace, Name: fresh.Name}
	if rec, ok := w.m[nn]; ok && (rec.uid != fresh.UID || rec.progress != progressOf(fresh)) {
		delete(w.m, nn)
	}
}

// forget ends the record of a Sandbox that is gone.
func (w *ownWrites) forget(nn types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, nn)
}

// len is how many records are kept (tests).
func (w *ownWrites) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m)
}
