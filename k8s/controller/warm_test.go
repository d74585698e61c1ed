package controller

import (
	"slices"
	"testing"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
)

// TestForksGoWhereAVMMIsPooled: the node view reads each node's pooled
// VMMs (pooled_vmms) into placement, so Sandboxes of a snapshot go first
// to a holder with one ready for it (a warm start), even with less free
// memory, and to the roomiest holder once those are used; a namespace's
// own snapshot counts its own pool.
func TestForksGoWhereAVMMIsPooled(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "roomy", memory: 64 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "warm", memory: 8 * gib, snapshots: map[string]int{"py": 512, "br": 512}})
	w := e.standIn["warm"]
	w.mu.Lock()
	w.pooled = map[string]int{"py": 2, "br": 1}
	w.owners = map[string]string{"br": "team-a"}
	w.mu.Unlock()
	e.poll()
	var nodes []string
	for _, name := range []string{"a", "b", "c"} {
		e.create(newSandbox(name, "py"))
		e.reconcile(name)
		nodes = append(nodes, e.get(name).Status.NodeName)
	}
	if !slices.Equal(nodes, []string{"warm", "warm", "roomy"}) {
		t.Fatalf("py's Sandboxes on %q, want warm's two pooled VMMs first, then roomy", nodes)
	}
	sb := newSandbox("d", "br")
	sb.Namespace = "team-a"
	e.create(sb)
	if got := e.reconcileIn("team-a", "d"); got.Status.NodeName != "warm" || got.Status.Phase != v1.SandboxRunning {
		t.Fatalf("team-a's br: %+v, want Running on warm", got.Status)
	}
}
