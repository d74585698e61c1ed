package controller

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/forkd-dev/forkd/k8s/placement"
)

// waitFor polls cond until it holds or the (generous: a loaded 2-core
// machine) deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNodeViewPollsUntilStopped(t *testing.T) {
	si := newStandIn(t, map[string]int{"py": 1024})
	v := &NodeView{
		Cluster:   placement.New(),
		Discovery: StaticDiscovery{{Node: "n1", URL: si.srv.URL, MemoryBytes: 8 * gib}},
		Token:     si.token, Interval: 10 * time.Millisecond, Log: testr.New(t),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Start(ctx) }()
	waitFor(t, "node n1 up", func() bool { return v.State("n1") == NodeUp })
	if got := v.SnapshotMemoryBytes("py", "team-a"); got != 1024<<20 {
		t.Errorf("snapshot memory %d, want 1 GiB", got)
	}
	if !v.SupportsIdempotency("n1") || !v.Holds("n1", "py") {
		t.Error("the node's features or snapshots were not recorded")
	}
	d, err := v.Cluster.Place(placement.Request{Key: "k", Snapshot: "py", MemoryBytes: gib})
	if err != nil || d.Node != "n1" || d.Pull {
		t.Fatalf("placement from the polled view: %+v, %v", d, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
}

func TestPodDiscovery(t *testing.T) {
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	sel := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/name": "forkd-node"})
	pod := func(name, node, ip string, phase corev1.PodPhase, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "forkd-system", Labels: map[string]string{"app.kubernetes.io/name": "forkd-node"}, Annotations: ann},
			Spec:       corev1.PodSpec{NodeName: node},
			Status:     corev1.PodStatus{Phase: phase, PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "w1"},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceMemory:           resource.MustParse("16Gi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
		}},
	}
	other := pod("other", "w1", "10.0.0.9", corev1.PodRunning, nil)
	other.Labels = map[string]string{"app": "else"}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		node,
		pod("d1", "w1", "10.0.0.5", corev1.PodRunning, nil),
		pod("d2", "w2", "10.0.0.6", corev1.PodRunning, map[string]string{AnnotationMemoryBytes: "1073741824"}),
		pod("d3", "w3", "", corev1.PodPending, nil),
		other,
	).Build()
	d := &PodDiscovery{Client: c, Namespace: "forkd-system", Selector: sel, Port: 7070, MemoryShare: 0.5}
	eps, err := d.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeEndpoint{
		{Node: "w1", URL: "https://10.0.0.5:7070", MemoryBytes: 8 * gib, DiskFreeBytes: 100 * gib},
		{Node: "w2", URL: "https://10.0.0.6:7070", MemoryBytes: gib, MemoryPinned: true},
	}
	if len(eps) != len(want) {
		t.Fatalf("endpoints %+v, want %+v", eps, want)
	}
	for i := range want {
		if eps[i] != want[i] {
			t.Errorf("endpoint %d: %+v, want %+v", i, eps[i], want[i])
		}
	}
}

// TestNodeViewUsesDaemonCapacity: a daemon reporting its capacity caps the
// node's room at its guest memory limit and takes what it committed
// outside placement off it; a figure pinned by the operator stays.
func TestNodeViewUsesDaemonCapacity(t *testing.T) {
	si := newStandIn(t, map[string]int{"py": 1024})
	si.mu.Lock()
	si.capacity = map[string]any{
		"guest_memory_committed_bytes": 3 * gib, "guest_memory_pooled_bytes": 0, "guest_memory_limit_bytes": 4 * gib,
		"host_memory_total_bytes": 16 * gib, "host_memory_available_bytes": 10 * gib,
		"disk_total_bytes": 100 * gib, "disk_free_bytes": 40 * gib, "sandboxes_running": 3,
	}
	si.mu.Unlock()
	for _, c := range []struct {
		name   string
		ep     NodeEndpoint
		fits   int64 // the largest sandbox that still fits
		diskGB int64
	}{
		{"daemon's limit", NodeEndpoint{MemoryBytes: 8 * gib, DiskFreeBytes: 500 * gib}, gib, 40},
		{"pinned by annotation", NodeEndpoint{MemoryBytes: 8 * gib, DiskFreeBytes: 500 * gib, MemoryPinned: true, DiskPinned: true}, 5 * gib, 500},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := c.ep
			ep.Node, ep.URL = "n1", si.srv.URL
			v := &NodeView{Cluster: placement.New(), Discovery: StaticDiscovery{ep}, Token: si.token, Log: testr.New(t)}
			if err := v.PollOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := v.Cluster.Place(placement.Request{Key: "big", Snapshot: "py", MemoryBytes: c.fits + gib}); err == nil {
				t.Fatalf("a %d GiB sandbox was placed: the room is %d GiB", c.fits/gib+1, c.fits/gib)
			}
			if _, err := v.Cluster.Place(placement.Request{Key: "ok", Snapshot: "py", MemoryBytes: c.fits}); err != nil {
				t.Fatalf("a %d GiB sandbox did not fit: %v", c.fits/gib, err)
			}
			if _, err := v.Cluster.Place(placement.Request{Key: "pull", Snapshot: "other", MemoryBytes: 0, Pullable: true, SnapshotBytes: (c.diskGB + 1) * gib}); err == nil {
				t.Fatalf("a snapshot of %d GB was sent to pull onto %d GB free", c.diskGB+1, c.diskGB)
			}
		})
	}
}

// TestFindSnapshotWaitsBoundedAndFairly: a lookup a node is slow to
// answer holds its caller at most FindWait (not sure; the lookup runs
// on), the tenant that started it starts no other meanwhile (not sure at
// once, no node asked), and another tenant's lookups run and answer; the
// slow lookup, once done, answers the first caller's retry.
func TestFindSnapshotWaitsBoundedAndFairly(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib})
	e.poll() // settled: a lookup may call a tag absent
	si := e.standIn["n1"]
	stall := make(chan struct{})
	si.mu.Lock()
	si.stall, si.stallTag = stall, "slow"
	si.snapshots["later"] = 256 // made since the last round
	si.mu.Unlock()
	gets := func(tag string) int {
		si.mu.Lock()
		defer si.mu.Unlock()
		return len(slices.DeleteFunc(slices.Clone(si.snapshotGets), func(g string) bool { return g != tag }))
	}

	e.nodes.FindWait = 50 * time.Millisecond
	asked := time.Now() // the slow Sandbox's first ask
	if held, sure := e.nodes.FindSnapshot(e.ctx, "slow", "team-a", asked); held || sure {
		t.Fatalf("a lookup the node does not answer: held %v, sure %v; want neither", held, sure)
	}
	if held, sure := e.nodes.FindSnapshot(e.ctx, "later", "team-a", time.Now()); held || sure || gets("later") != 0 {
		t.Fatalf("team-a's second tag while its lookup runs: held %v, sure %v, %d GETs; want not sure, no GET", held, sure, gets("later"))
	}

	e.nodes.FindWait = time.Minute // the lookup's own time, not this bound
	if held, sure := e.nodes.FindSnapshot(e.ctx, "later", "team-b", time.Now()); !held || !sure {
		t.Fatalf("team-b's lookup while team-a's is held up: held %v, sure %v; want found", held, sure)
	}

	// The slow lookup ends; the Sandbox's retry, passing its first ask,
	// is answered by it (sure: absent) and asks no node again.
	close(stall)
	if held, sure := e.nodes.FindSnapshot(e.ctx, "slow", "team-a", asked); held || !sure || gets("slow") != 1 {
		t.Fatalf("the retry after the slow lookup: held %v, sure %v, %d GETs of slow; want sure absent from the one lookup",
			held, sure, gets("slow"))
	}
	waitFor(t, "team-a's lookups to run again", func() bool {
		held, sure := e.nodes.FindSnapshot(e.ctx, "absent", "team-a", time.Now())
		return !held && sure
	})
}
