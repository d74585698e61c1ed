package controller

// The Sandbox reconciler and namespaces: which snapshot a namespace's
// Sandbox may fork, how much it reserves, where a tag made since the last
// round is found, and where a pull is never sent.

import (
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// TestPullNotSentWhereTheTagIsAnothers: a node holding the tag for
// another namespace is never sent a pull of it, though it has the most
// room; the pull goes to a node without the tag.
func TestPullNotSentWhereTheTagIsAnothers(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "roomy", memory: 64 * gib, snapshots: map[string]int{"py": 256}},
		nodeSpec{name: "small", memory: 8 * gib})
	e.standIn["roomy"].mu.Lock()
	e.standIn["roomy"].owners = map[string]string{"py": "team-a"}
	e.standIn["roomy"].mu.Unlock()
	e.poll()
	sb := newSandbox("b", "py")
	sb.Namespace = "team-b"
	sb.Spec.Snapshot.Image = "registry.example.com/snaps/py:v1"
	e.create(sb)
	if got := e.reconcileIn("team-b", "b"); got.Status.NodeName != "small" || got.Status.Phase != v1.SandboxRunning {
		t.Fatalf("team-b's py: %+v, want pulled and Running on small", got.Status)
	}
	if pulls := e.standIn["roomy"].pulls; len(pulls) != 0 {
		t.Errorf("roomy, holding team-a's py, was sent pulls %q", pulls)
	}
}

// TestMemoryOfTheSnapshotTheNamespaceForks: a Sandbox naming no memory
// reserves that of the snapshot its namespace forks under the tag (its
// own first, else the public one), never another namespace's.
func TestMemoryOfTheSnapshotTheNamespaceForks(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "a", memory: 64 * gib, snapshots: map[string]int{"py": 8192}},
		nodeSpec{name: "b", memory: 64 * gib, snapshots: map[string]int{"py": 256}},
		nodeSpec{name: "c", memory: 64 * gib, snapshots: map[string]int{"py": 1024}})
	e.standIn["a"].mu.Lock()
	e.standIn["a"].owners = map[string]string{"py": "team-a"}
	e.standIn["a"].mu.Unlock()
	e.standIn["c"].mu.Lock()
	e.standIn["c"].owners = map[string]string{"py": "team-c"}
	e.standIn["c"].mu.Unlock()
	e.poll()
	for ns, want := range map[string]int64{"team-a": 8192 << 20, "team-b": 256 << 20, "team-c": 1024 << 20} {
		sb := newSandbox("x", "py")
		sb.Namespace = ns
		if got := e.sbr.memoryFor(sb); got != want {
			t.Errorf("namespace %s reserves %d bytes for py, want %d", ns, got, want)
		}
	}
}

// TestNodeNotAnsweringIsNoProofOfAbsence: a lookup that could not ask
// every node (one down) does not call a tag absent: the Sandbox waits
// (NoCapacity, retried soon) rather than being SnapshotNotFound.
func TestNodeNotAnsweringIsNoProofOfAbsence(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "node-a", memory: 8 * gib, snapshots: map[string]int{"py": 256}},
		nodeSpec{name: "node-b", memory: 8 * gib})
	e.poll() // settled
	e.standIn["node-b"].setDown(true)
	e.create(newSandbox("br", "py-br"))
	res := e.reconcile("br")
	wantCondition(t, e.get("br").Status.Conditions, v1.ConditionPlaced, metav1.ConditionFalse, v1.ReasonNoCapacity)
	if res.RequeueAfter != 2*time.Second {
		t.Errorf("requeue after %v, want 2s", res.RequeueAfter)
	}
}

// TestForkOfASnapshotMadeSinceTheLastRound: a tag no node was known to
// hold at the last poll (a branch made through the gateway since) is
// looked for on the nodes when placement finds no holder, and the
// sandbox forks there at once, without waiting for a round; a tag no
// node holds is looked for once for a Sandbox and its retry (the retry
// is answered by the lookup begun after its first ask), and a tag known
// held is never looked for.
func TestForkOfASnapshotMadeSinceTheLastRound(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "node-a", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "node-b", memory: 8 * gib})
	b := e.standIn["node-b"]
	b.mu.Lock()
	b.snapshots["py-br-1"] = 512 // branched after the poll
	b.mu.Unlock()
	e.create(newSandbox("child", "py-br-1"))
	e.reconcile("child")
	if sb := e.get("child"); sb.Status.NodeName != "node-b" || sb.Status.Phase != v1.SandboxRunning {
		t.Fatalf("child of a new branch: %+v, want Running on node-b without a new round", sb.Status)
	}

	e.create(newSandbox("typo", "py-typo"))
	e.reconcile("typo")
	e.reconcile("typo")
	if sb := e.get("typo"); sb.Status.Phase != v1.SandboxPending {
		t.Fatalf("a tag no node holds: %+v, want Pending", sb.Status)
	}
	e.create(newSandbox("known", "py"))
	e.reconcile("known")
	count := func(si *standIn, tag string) int {
		si.mu.Lock()
		defer si.mu.Unlock()
		n := 0
		for _, g := range si.snapshotGets {
			if g == tag {
				n++
			}
		}
		return n
	}
	for _, n := range []string{"node-a", "node-b"} {
		if got := count(e.standIn[n], "py-typo"); got != 1 {
			t.Errorf("%s asked for py-typo %d times in two reconciles one after the other, want once (the retry is answered by the lookup begun after the Sandbox first asked)", n, got)
		}
		if got := count(e.standIn[n], "py"); got != 0 {
			t.Errorf("%s asked for py, which node-a is known to hold, %d times", n, got)
		}
	}
}

// reconcileIn runs the Sandbox reconciler on namespace/name until it has
// nothing more to do now (see reconcile).
func (e *testEnv) reconcileIn(namespace, name string) *v1.Sandbox {
	e.t.Helper()
	key := types.NamespacedName{Namespace: namespace, Name: name}
	e.reconcileKey(key)
	var sb v1.Sandbox
	if err := e.client.Get(e.ctx, key, &sb); err != nil {
		e.t.Fatal(err)
	}
	return &sb
}

// TestNamespacesForkOnlyWhatTheySee: a node's snapshot owned by one
// namespace (a branch of its sandbox) is placed for that namespace only;
// another namespace naming the tag is SnapshotNotFound, placed nowhere
// (no reservation on, or word of, the node holding it); the operator's
// snapshots are every namespace's.
func TestNamespacesForkOnlyWhatTheySee(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "node-a", memory: 8 * gib, snapshots: map[string]int{"br": 256}},
		nodeSpec{name: "node-b", memory: 8 * gib, snapshots: map[string]int{"py": 256}})
	a := e.standIn["node-a"]
	a.mu.Lock()
	a.owners = map[string]string{"br": "team-a"}
	a.mu.Unlock()
	e.poll()
	for _, c := range []struct{ ns, name, tag string }{{"team-b", "x", "br"}, {"team-a", "y", "br"}, {"team-b", "z", "py"}} {
		sb := newSandbox(c.name, c.tag)
		sb.Namespace = c.ns
		e.create(sb)
	}
	x := e.reconcileIn("team-b", "x")
	if x.Status.NodeName != "" {
		t.Errorf("team-b's Sandbox of team-a's branch was placed on %q", x.Status.NodeName)
	}
	wantCondition(t, x.Status.Conditions, v1.ConditionPlaced, metav1.ConditionFalse, v1.ReasonSnapshotNotFound)
	if y := e.reconcileIn("team-a", "y"); y.Status.Phase != v1.SandboxRunning || y.Status.NodeName != "node-a" {
		t.Errorf("team-a's Sandbox of its branch: %+v, want Running on node-a", y.Status)
	}
	if call := a.lastFork(); call.Tenant != "team-a" || len(a.forks) != 1 {
		t.Errorf("node-a's forks: %d, the last acting for %q; want one, for team-a", len(a.forks), call.Tenant)
	}
	if z := e.reconcileIn("team-b", "z"); z.Status.Phase != v1.SandboxRunning || z.Status.NodeName != "node-b" {
		t.Errorf("team-b's Sandbox of the operator's py: %+v, want Running on node-b", z.Status)
	}
}

// TestConcurrentForksOfANewBranch: Sandboxes of a tag made since the
// last round, reconciled at once (a gateway fork with count 3), share one
// lookup and all run; none is told the tag does not exist.
func TestConcurrentForksOfANewBranch(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "node-a", memory: 8 * gib, snapshots: map[string]int{"py": 256}})
	a := e.standIn["node-a"]
	a.mu.Lock()
	a.snapshots["py-br"] = 256
	a.mu.Unlock()
	names := []string{"c1", "c2", "c3"}
	for _, n := range names {
		e.create(newSandbox(n, "py-br"))
	}
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: n}}
			for i := 0; i < 5; i++ {
				if _, err := e.sbr.Reconcile(e.ctx, req); err == nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, n := range names {
		if sb := e.get(n); sb.Status.Phase != v1.SandboxRunning {
			t.Errorf("%s: %+v, want Running", n, sb.Status)
		}
	}
}
