package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/client-go/tools/events"

	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/placement"
)

const gib = int64(1) << 30

// testEnv is the controller wired to a fake apiserver client and contract
// stand-ins for the node daemons, reconciled by hand: each test drives
// Reconcile and NodeView.PollOnce itself, so nothing waits on time.
type testEnv struct {
	t       *testing.T
	ctx     context.Context
	client  client.Client
	nodes   *NodeView
	sbr     *SandboxReconciler
	claims  *ClaimReconciler
	pools   *WarmPoolReconciler
	standIn map[string]*standIn
	disc    *mutableDiscovery
	now     time.Time
	events  *events.FakeRecorder
}

// mutableDiscovery is a StaticDiscovery a test can change.
type mutableDiscovery struct{ eps StaticDiscovery }

func (m *mutableDiscovery) Discover(ctx context.Context) ([]NodeEndpoint, error) {
	return m.eps.Discover(ctx)
}

type nodeSpec struct {
	name      string
	memory    int64
	snapshots map[string]int
}

func newTestEnv(t *testing.T, specs ...nodeSpec) *testEnv {
	t.Helper()
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := withUIDs(fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&v1.Sandbox{}, &v1.SandboxClaim{}, &v1.SandboxWarmPool{}).
		WithIndex(&v1.Sandbox{}, IndexNodeName, NodeNameOf).Build())
	e := &testEnv{t: t, ctx: context.Background(), client: c, standIn: map[string]*standIn{},
		disc: &mutableDiscovery{}, now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	for _, s := range specs {
		si := newStandIn(t, s.snapshots)
		e.standIn[s.name] = si
		e.disc.eps = append(e.disc.eps, NodeEndpoint{Node: s.name, URL: si.srv.URL, MemoryBytes: s.memory, DiskFreeBytes: 100 * gib})
	}
	log := testr.New(t)
	cluster := placement.New()
	e.nodes = &NodeView{Cluster: cluster, Discovery: e.disc, Token: "forkd_standin-token",
		FailureThreshold: 2, PollTimeout: 30 * time.Second, LookupKept: time.Hour, Log: log}
	e.sbr = &SandboxReconciler{Client: c, Cluster: cluster, Nodes: e.nodes, Log: log,
		Now: func() time.Time { return e.now }}
	e.nodes.OnNodeUp, e.nodes.OnNodeLost = e.sbr.BindNode, e.sbr.MarkNodeLost
	e.events = events.NewFakeRecorder(1000)
	e.sbr.Events = e.events
	e.claims = &ClaimReconciler{Client: c, Scheme: scheme, Preplacer: e.sbr, Events: e.events, Log: log,
		Now: func() time.Time { return e.now }}
	e.pools = &WarmPoolReconciler{Client: c, Scheme: scheme, Log: log}
	e.poll()
	return e
}

func (e *testEnv) poll() {
	e.t.Helper()
	if err := e.nodes.PollOnce(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

func newSandbox(name, tag string) *v1.Sandbox {
	return &v1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       v1.SandboxSpec{SandboxBlueprint: v1.SandboxBlueprint{Snapshot: v1.SnapshotRef{Tag: tag}}},
	}
}

func (e *testEnv) create(obj client.Object) {
	e.t.Helper()
	if err := e.client.Create(e.ctx, obj); err != nil {
		e.t.Fatal(err)
	}
}

// reconcile runs the Sandbox reconciler until it has nothing more to do
// now (no error, no immediate requeue), at most 5 times.
func (e *testEnv) reconcile(name string) ctrl.Result {
	e.t.Helper()
	return e.reconcileKey(types.NamespacedName{Namespace: "default", Name: name})
}

// reconcileKey is reconcile of any namespace's Sandbox.
func (e *testEnv) reconcileKey(key types.NamespacedName) ctrl.Result {
	e.t.Helper()
	req := ctrl.Request{NamespacedName: key}
	var res ctrl.Result
	var err error
	for range 5 {
		res, err = e.sbr.Reconcile(e.ctx, req)
		if err == nil {
			return res
		}
	}
	e.t.Fatalf("reconcile %s: %v", key, err)
	return res
}

func (e *testEnv) get(name string) *v1.Sandbox {
	e.t.Helper()
	var sb v1.Sandbox
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, &sb); err != nil {
		e.t.Fatal(err)
	}
	return &sb
}

func wantCondition(t *testing.T, conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	c := meta.FindStatusCondition(conds, typ)
	if c == nil || c.Status != status || c.Reason != reason {
		t.Fatalf("condition %s: got %+v, want status %s reason %s", typ, c, status, reason)
	}
}

func TestForkOnTheNodeHoldingTheSnapshot(t *testing.T) {
	// node-a has more memory but not the snapshot: placement must pick
	// node-b, the holder.
	e := newTestEnv(t,
		nodeSpec{name: "node-a", memory: 64 * gib},
		nodeSpec{name: "node-b", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.create(newSandbox("sb1", "py"))
	e.reconcile("sb1")

	sb := e.get("sb1")
	if sb.Status.NodeName != "node-b" || sb.Status.Phase != v1.SandboxRunning || sb.Status.SandboxID == "" {
		t.Fatalf("status %+v, want Running on node-b with an id", sb.Status)
	}
	if want := e.standIn["node-b"].srv.URL + "/v1/sandboxes/" + sb.Status.SandboxID; sb.Status.Endpoint != want {
		t.Fatalf("endpoint %q, want %q", sb.Status.Endpoint, want)
	}
	wantCondition(t, sb.Status.Conditions, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonForked)
	wantCondition(t, sb.Status.Conditions, v1.ConditionPlaced, metav1.ConditionTrue, ReasonPlaced)
	if f, _, _ := e.standIn["node-a"].counts(); f != 0 {
		t.Fatalf("node-a got %d forks, want 0", f)
	}
	if f, c, _ := e.standIn["node-b"].counts(); f != 1 || c != 1 {
		t.Fatalf("node-b: %d fork calls, %d created; want 1, 1", f, c)
	}
	if !containsString(sb.Finalizers, Finalizer) {
		t.Fatalf("finalizers %v lack %s", sb.Finalizers, Finalizer)
	}
}

func TestForkRequestBody(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	sb := newSandbox("body", "py")
	timeout, idle := int64(600), int64(60)
	cpu := resource.MustParse("500m")
	mem := resource.MustParse("1Gi")
	sb.Spec.Resources = v1.Resources{CPU: &cpu, Memory: &mem}
	sb.Spec.Network = &v1.NetworkPolicy{Mode: v1.NetworkAllow, Allow: []string{"example.com", "203.0.113.7:443/tcp"}, MaxConnections: 64, RateMbit: 100}
	sb.Spec.Lifecycle = &v1.Lifecycle{TimeoutSeconds: &timeout, IdleTimeoutSeconds: &idle}
	// The gateway's metadata goes along; it cannot override the
	// controller's own keys.
	sb.Annotations = map[string]string{AnnotationForkMetadata: `{"run":"r1","` + MetaName + `":"spoofed"}`}
	e.create(sb)
	e.reconcile("body")

	call := e.standIn["n1"].lastFork()
	b := call.Body
	if call.Key != "k8s-uid-body" {
		t.Errorf("Idempotency-Key %q, want k8s-uid-body", call.Key)
	}
	if call.Tenant != "k8s.default" {
		t.Errorf("the fork acted for tenant %q, want k8s.default (namespace default, not the operator's tenant)", call.Tenant)
	}
	if b.Tag != "py" || *b.Count != 1 || *b.TimeoutS != 600 || *b.IdleTimeoutS != 60 || *b.CPUs != 0.5 {
		t.Errorf("fork body %+v", b)
	}
	if b.Network == nil || b.Network.Mode != "allow" || len(b.Network.Allow) != 2 || *b.Network.MaxConnections != 64 || *b.Network.RateMbit != 100 {
		t.Errorf("fork network %+v", b.Network)
	}
	want := map[string]string{MetaNamespace: "default", MetaName: "body", MetaUID: "uid-body", "run": "r1"}
	for k, v := range want {
		if b.Metadata[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, b.Metadata[k], v)
		}
	}
}

func TestReconcilingTwiceForksOnce(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.create(newSandbox("once", "py"))
	for range 3 {
		e.reconcile("once")
	}
	first := e.get("once").Status.SandboxID
	if f, c, _ := e.standIn["n1"].counts(); f != 1 || c != 1 {
		t.Fatalf("%d fork calls, %d created after 3 reconciles; want 1, 1", f, c)
	}

	// The fork's answer lost (a crash before the status write): the
	// status says placed, not forked. The retry sends the same key and
	// gets the first sandbox back.
	sb := e.get("once")
	sb.Status.SandboxID, sb.Status.Endpoint, sb.Status.Phase = "", "", v1.SandboxPending
	if err := e.client.Status().Update(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	e.reconcile("once")
	if f, c, _ := e.standIn["n1"].counts(); f != 2 || c != 1 {
		t.Fatalf("after a lost answer: %d fork calls, %d created; want 2 (one replayed), 1", f, c)
	}
	if got := e.get("once").Status.SandboxID; got != first {
		t.Fatalf("replayed fork gave %q, want the first sandbox %q", got, first)
	}
}

func TestDeleteThroughFinalizer(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 4 * gib, snapshots: map[string]int{"py": 512}})
	sb := newSandbox("del", "py")
	mem := resource.MustParse("4Gi") // the whole node
	sb.Spec.Resources.Memory = &mem
	e.create(sb)
	e.reconcile("del")
	id := e.get("del").Status.SandboxID

	if err := e.client.Delete(e.ctx, e.get("del")); err != nil {
		t.Fatal(err)
	}
	e.reconcile("del")
	if _, _, dels := e.standIn["n1"].counts(); len(dels) != 1 || dels[0] != id {
		t.Fatalf("DELETEs on the node %v, want [%s]", dels, id)
	}
	var gone v1.Sandbox
	if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: "del"}, &gone); !apierrors.IsNotFound(err) {
		t.Fatalf("Sandbox still there after its finalizer: %v", err)
	}
	// The reservation went with it: the whole node is free again.
	if d, err := e.nodes.Cluster.Place(placement.Request{Key: "probe", Snapshot: "py", MemoryBytes: 4 * gib}); err != nil || d.Node != "n1" {
		t.Fatalf("placing 4 GiB after the delete: %+v, %v", d, err)
	}
}

func TestDeleteBeforeTheForkAnswerWasRecorded(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.create(newSandbox("lostanswer", "py"))
	e.reconcile("lostanswer")
	sb := e.get("lostanswer")
	id := sb.Status.SandboxID
	sb.Status.SandboxID, sb.Status.Phase = "", v1.SandboxPending
	if err := e.client.Status().Update(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Delete(e.ctx, e.get("lostanswer")); err != nil {
		t.Fatal(err)
	}
	e.reconcile("lostanswer")
	if _, _, dels := e.standIn["n1"].counts(); len(dels) != 1 || dels[0] != id {
		t.Fatalf("DELETEs %v, want the fork found by its uid label [%s]", dels, id)
	}
}

func TestNodeLossMarksSandboxesLost(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 2 * gib, snapshots: map[string]int{"js": 512}})
	for _, n := range []string{"a", "b"} {
		e.create(newSandbox(n, "py"))
		e.reconcile(n)
	}
	e.create(newSandbox("other", "js"))
	e.reconcile("other")

	e.standIn["n1"].setDown(true)
	e.poll() // 1 failure: not ready, not lost
	if e.get("a").Status.Phase != v1.SandboxRunning {
		t.Fatal("one failed poll made the sandbox lost; the threshold is 2")
	}
	e.poll() // 2 failures: lost
	for _, n := range []string{"a", "b"} {
		sb := e.get(n)
		if sb.Status.Phase != v1.SandboxLost {
			t.Fatalf("%s: phase %s, want Lost", n, sb.Status.Phase)
		}
		wantCondition(t, sb.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonNodeLost)
	}
	if p := e.get("other").Status.Phase; p != v1.SandboxRunning {
		t.Fatalf("the sandbox on the healthy node is %s", p)
	}
	// Deleting a lost Sandbox asks nothing of its gone node.
	if err := e.client.Delete(e.ctx, e.get("a")); err != nil {
		t.Fatal(err)
	}
	e.reconcile("a")
	if _, _, dels := e.standIn["n1"].counts(); len(dels) != 0 {
		t.Fatalf("DELETE sent to a lost node: %v", dels)
	}
}

func TestDaemonPodGoneMarksSandboxesLost(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.create(newSandbox("a", "py"))
	e.reconcile("a")
	e.disc.eps = nil // the daemon pod is gone
	e.poll()
	e.poll()
	if p := e.get("a").Status.Phase; p != v1.SandboxLost {
		t.Fatalf("phase %s, want Lost", p)
	}
}

// TestNoCapacity: a holder without room is NoCapacity; a tag no node
// holds, with no image, is SnapshotNotFound once the node view has
// settled and every node answered, NoCapacity (still looking, retried
// soon) before; all are retried.
func TestNoCapacity(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.create(newSandbox("early", "absent"))
	res := e.reconcile("early")
	wantCondition(t, e.get("early").Status.Conditions, v1.ConditionPlaced, metav1.ConditionFalse, v1.ReasonNoCapacity)
	if res.RequeueAfter != 2*time.Second {
		t.Errorf("a tag not found before the view settled: requeue after %v, want 2s", res.RequeueAfter)
	}
	e.poll() // settled: FailureThreshold rounds
	big := newSandbox("big", "py")
	mem := resource.MustParse("16Gi")
	big.Spec.Resources.Memory = &mem
	e.create(big)
	e.create(newSandbox("nope", "absent"))
	for name, reason := range map[string]string{"big": v1.ReasonNoCapacity, "nope": v1.ReasonSnapshotNotFound} {
		res := e.reconcile(name)
		sb := e.get(name)
		if sb.Status.NodeName != "" || res.RequeueAfter == 0 {
			t.Fatalf("%s: status %+v, result %+v: want unplaced and a retry", name, sb.Status, res)
		}
		wantCondition(t, sb.Status.Conditions, v1.ConditionPlaced, metav1.ConditionFalse, reason)
	}
}

func TestPullForksTheImageReference(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib})
	sb := newSandbox("pull", "py")
	sb.Spec.Snapshot.Image = "registry.example.com/snaps/py:v1"
	e.create(sb)
	e.reconcile("pull")
	got := e.get("pull")
	if got.Status.Phase != v1.SandboxRunning || got.Status.NodeName != "n1" {
		t.Fatalf("status %+v", got.Status)
	}
	wantCondition(t, got.Status.Conditions, v1.ConditionPlaced, metav1.ConditionTrue, v1.ReasonPulling)
	si := e.standIn["n1"]
	if tag := si.lastFork().Body.Tag; tag != "py" {
		t.Fatalf("fork tag %q, want the template's tag py, pulled first", tag)
	}
	si.mu.Lock()
	pulls := append([]string(nil), si.pulls...)
	si.mu.Unlock()
	if len(pulls) != 1 || pulls[0] != sb.Spec.Snapshot.Image+" as py" {
		t.Fatalf("pulls %q, want the image under the template's tag", pulls)
	}
	// The node now reports holding py: the next sandbox goes there as to
	// any holder, with no pull.
	e.poll()
	sb2 := newSandbox("pull2", "py")
	sb2.Spec.Snapshot.Image = sb.Spec.Snapshot.Image
	e.create(sb2)
	e.reconcile("pull2")
	got = e.get("pull2")
	wantCondition(t, got.Status.Conditions, v1.ConditionPlaced, metav1.ConditionTrue, ReasonPlaced)
	if got.Status.Phase != v1.SandboxRunning || len(si.pulls) != 1 {
		t.Fatalf("second sandbox: status %+v, pulls %q", got.Status, si.pulls)
	}
	// Pulled acting for the namespace, so the snapshot is its own on the
	// node: another namespace naming the tag pulls its own elsewhere, or
	// here is refused, never forks this one.
	si.mu.Lock()
	owner := si.ownerOf("py")
	si.mu.Unlock()
	if owner != TenantFor(sb.Namespace) {
		t.Errorf("the pulled py is owned by %q, want the namespace's tenant %q", owner, TenantFor(sb.Namespace))
	}
}

// TestFailedPullPlacesAgain: a registry that lacks the image fails the
// pull; the node stops being sent sandboxes to wait for it and the
// sandbox is placed again.
func TestFailedPullPlacesAgain(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib})
	e.standIn["n1"].pullFails = true
	sb := newSandbox("nopull", "py")
	sb.Spec.Snapshot.Image = "registry.example.com/snaps/py:v1"
	e.create(sb)
	e.reconcile("nopull")
	got := e.get("nopull")
	if got.Status.NodeName != "" || got.Status.Phase != v1.SandboxPending || got.Status.SandboxID != "" {
		t.Fatalf("status after a failed pull %+v", got.Status)
	}
	wantCondition(t, got.Status.Conditions, v1.ConditionPlaced, metav1.ConditionFalse, ReasonPullFailed)
	if forks, _, _ := e.standIn["n1"].counts(); forks != 0 {
		t.Fatalf("%d forks after a failed pull", forks)
	}
	// Its reservation was given back: placing it anew is a new decision.
	if _, err := e.nodes.Cluster.Place(placement.Request{Key: "default/nopull", Snapshot: "x", MemoryBytes: 1, OnlyNew: true}); errors.Is(err, placement.ErrPlaced) {
		t.Fatalf("the Sandbox still holds its reservation after the failed pull: %v", err)
	}
}

func TestShutdownTime(t *testing.T) {
	for _, policy := range []v1.ShutdownPolicy{v1.ShutdownPolicyRetain, v1.ShutdownPolicyDelete} {
		t.Run(string(policy), func(t *testing.T) {
			e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
			sb := newSandbox("exp", "py")
			at := metav1.NewTime(e.now.Add(time.Hour))
			sb.Spec.Lifecycle = &v1.Lifecycle{ShutdownTime: &at, ShutdownPolicy: policy}
			e.create(sb)
			res := e.reconcile("exp")
			if res.RequeueAfter > time.Minute || res.RequeueAfter <= 0 {
				t.Fatalf("requeue after %v, want at most the resync", res.RequeueAfter)
			}
			id := e.get("exp").Status.SandboxID

			e.now = e.now.Add(2 * time.Hour)
			e.reconcile("exp")
			if _, _, dels := e.standIn["n1"].counts(); len(dels) != 1 || dels[0] != id {
				t.Fatalf("DELETEs %v, want [%s]", dels, id)
			}
			if policy == v1.ShutdownPolicyDelete {
				e.reconcile("exp") // the finalizer
				var gone v1.Sandbox
				if err := e.client.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: "exp"}, &gone); !apierrors.IsNotFound(err) {
					t.Fatalf("Delete policy: object still there: %v", err)
				}
				return
			}
			got := e.get("exp")
			if got.Status.Phase != v1.SandboxEnded {
				t.Fatalf("phase %s, want Ended", got.Status.Phase)
			}
			wantCondition(t, got.Status.Conditions, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonExpired)
		})
	}
}

func TestSandboxEndedOnItsNode(t *testing.T) {
	e := newTestEnv(t, nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	e.create(newSandbox("dies", "py"))
	e.reconcile("dies")
	e.standIn["n1"].setState(e.get("dies").Status.SandboxID, "dead")
	e.reconcile("dies")
	if p := e.get("dies").Status.Phase; p != v1.SandboxEnded {
		t.Fatalf("phase %s, want Ended", p)
	}
}

func TestPinnedNode(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 8 * gib, snapshots: map[string]int{"py": 512}})
	sb := newSandbox("pin", "py")
	sb.Spec.NodeName = "n2"
	e.create(sb)
	e.reconcile("pin")
	if got := e.get("pin"); got.Status.NodeName != "n2" || got.Status.Phase != v1.SandboxRunning {
		t.Fatalf("status %+v, want Running on n2", got.Status)
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
