package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/forkd-dev/forkd/k8s/controller"
	"github.com/forkd-dev/forkd/test/k8s/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// crdDir is k8s/config/crd, relative to this package's directory.
var crdDir = filepath.Join("..", "..", "..", "k8s", "config", "crd")

const (
	// LoadEnv=1 runs the scale (1,000 nodes, 100,000 sandboxes in
	// the view); without it a small one that make test-k8s affords.
	LoadEnv = "FORKD_K8S_LOAD"
	// ObjectsEnv sets how many of the view's sandboxes are Sandbox
	// objects in etcd at full scale (the rest are bare reservations).
	ObjectsEnv = "FORKD_K8S_LOAD_OBJECTS"

	token       = "forkd_loadtest-token"
	sandboxMem  = int64(SnapshotMemoryMiB) << 20
	nodeMemory  = int64(64) << 30
	createConns = 8 // concurrent creates by the test
	// settleRounds is the node view's FailureThreshold, so Settled comes
	// that many poll rounds after start.
	settleRounds = 3
)

// scale is one run's size.
type scale struct {
	nodes, tags int
	// view is the sandboxes in the controller's view before the batch;
	// objects of them are Running Sandbox objects in etcd, the rest bare
	// placement reservations (Cluster.Bind) that the stand-in counts as
	// running.
	view, objects int
	// batch Sandboxes, then batch SandboxClaims, go through the
	// controller at once (throughput, latency under a burst); then single
	// claims one after another (the latency a claim adds to a fork).
	batch, single int
	pollInterval  time.Duration
	deadline      time.Duration
}

func scaleFor(t *testing.T) scale {
	if testing.Short() {
		t.Skip("-short: the load test starts a control plane and a controller")
	}
	if os.Getenv(LoadEnv) != "1" {
		return scale{nodes: 40, tags: 20, view: 2000, objects: 400, batch: 60, single: 10,
			pollInterval: time.Second, deadline: 3 * time.Minute}
	}
	s := scale{nodes: 1000, tags: 200, view: 100_000, objects: 30_000, batch: 1000, single: 100,
		pollInterval: 5 * time.Second, deadline: 10 * time.Minute}
	if v, err := strconv.Atoi(os.Getenv(ObjectsEnv)); err == nil && v >= 0 && v <= s.view {
		s.objects = v
	}
	return s
}

// fleet lays out the nodes: tag k is held by max(5, nodes/(k+1)) nodes
// drawn at random (tag 0 by all), as in k8s/placement's scale benchmark.
// Every tenth node is tight: room for its share of the view and two more.
func fleet(s scale) []StandInNode {
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := make([]StandInNode, s.nodes)
	perNode := s.view / s.nodes
	for i := range nodes {
		nodes[i] = StandInNode{Name: fmt.Sprintf("node-%04d", i), MemoryLimitBytes: nodeMemory, DiskFreeBytes: 500 << 30}
		if i%10 == 9 {
			nodes[i].MemoryLimitBytes = int64(perNode+2) * sandboxMem
		}
	}
	for k := range s.tags {
		for _, i := range rng.Perm(s.nodes)[:max(min(5, s.nodes), s.nodes/(k+1))] {
			nodes[i].Snapshots = append(nodes[i].Snapshots, tagName(k))
		}
	}
	return nodes
}

func tagName(k int) string { return fmt.Sprintf("snap-%03d", k) }

// TestControllerAtScale runs the controller against a real apiserver with
// many simulated nodes and a loaded view, then sends a batch of Sandboxes
// and one of SandboxClaims through it. It asserts what must hold at any
// speed (every sandbox Running on a node holding its snapshot, no node
// past its memory, no fork refused) and logs the timings.
func TestControllerAtScale(t *testing.T) {
	s := scaleFor(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, restCfg := testenv.Start(t)
	if _, err := envtest.InstallCRDs(restCfg, envtest.CRDInstallOptions{
		Paths: []string{crdDir}, ErrorIfPathMissing: true, MaxTime: 2 * time.Minute,
	}); err != nil {
		t.Fatalf("install the CRDs from %s: %v", crdDir, err)
	}
	// As ctrl.GetConfig (forkd-controller's) does: no client-side rate
	// limit; the apiserver's priority and fairness governs.
	cfg := rest.CopyConfig(restCfg)
	cfg.QPS, cfg.Burst = -1, 0
	scheme, err := controller.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"preload", "batch", "claims", "single"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}

	nodes := fleet(s)
	stand := NewFleetStandIn(token, nodes)
	srv := httptest.NewServer(stand)
	t.Cleanup(srv.Close)
	var disc controller.StaticDiscovery
	for _, n := range nodes {
		disc = append(disc, controller.NodeEndpoint{Node: n.Name, URL: srv.URL + "/n/" + n.Name,
			MemoryBytes: nodeMemory, DiskFreeBytes: n.DiskFreeBytes})
	}

	began := time.Now()
	preloadObjects(t, ctx, c, s, nodes, stand)
	took := time.Since(began)
	t.Logf("preload: %d Running Sandbox objects written (create + status) in %v: %.0f objects/s",
		s.objects, took.Round(time.Millisecond), float64(s.objects)/took.Seconds())
	heapBase := heapBytes()

	// The controller, as forkd-controller wires it, in this process.
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	// One client for every node: they share one host:port here.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	ctrls, err := controller.Setup(mgr, controller.Options{
		Discovery: disc, Token: token, HTTP: &http.Client{Transport: tr},
		PollInterval: s.pollInterval, FailureThreshold: settleRounds,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctrls.Sandboxes.RetryInterval = 2 * time.Second
	mgrCtx, stopMgr := context.WithCancel(ctx)
	mgrDone := make(chan error, 1)
	started := time.Now()
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stopMgr()
		if err := <-mgrDone; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	// The view loads: every node answers, every preloaded Sandbox is
	// reconciled to its check on the node (its reservation bound).
	waitFor(t, s.deadline, "every node up in the view", func() bool {
		for _, n := range nodes {
			if ctrls.Nodes.State(n.Name) != controller.NodeUp {
				return false
			}
		}
		return true
	})
	nodesUp := time.Since(started)
	waitFor(t, s.deadline, "every preloaded Sandbox checked on its node", func() bool {
		return stand.Gets() >= int64(s.objects)
	})
	viewLoaded := time.Since(started)
	// The first round's OnNodeUp (BindNode per node, each listing every
	// Sandbox in the cache) runs before the round ends; the view settles
	// settleRounds rounds later. Measuring before that would share the
	// CPU with it.
	waitFor(t, s.deadline, "the node view settled", ctrls.Nodes.Settled)
	settled := time.Since(started)
	// What a restart costs per node: rebuilding its reservations lists
	// every Sandbox in the cache (OnNodeUp, once per node).
	bindNodes := min(10, len(nodes))
	bindBegan := time.Now()
	for _, n := range nodes[:bindNodes] {
		ctrls.Sandboxes.BindNode(ctx, n.Name)
	}
	bindOne := time.Since(bindBegan) / time.Duration(bindNodes)
	bare := bindBare(t, ctrls, s, nodes, stand)
	heapView := heapBytes()
	t.Logf("view: %d nodes up %v after start; %d Sandbox objects reconciled %v after start; settled (%d poll rounds of %v, the first one's rebinding included) %v after start; %d bare reservations bound",
		s.nodes, nodesUp.Round(time.Millisecond), s.objects, viewLoaded.Round(time.Millisecond),
		settleRounds, s.pollInterval, settled.Round(time.Millisecond), bare)
	t.Logf("rebinding one node's Sandboxes (OnNodeUp after a restart) took %v (mean of %d) with %d objects in the cache: about %v for %d nodes",
		bindOne.Round(time.Microsecond), bindNodes, s.objects, (bindOne * time.Duration(s.nodes)).Round(time.Millisecond), s.nodes)
	t.Logf("heap in use after GC: %.1f MiB before the controller started; %.1f MiB more with the view loaded (%d nodes, %d Sandbox objects in the cache, %d reservations in placement); the node polls and checks go on meanwhile, so ±10 MiB",
		mib(heapBase), mib(heapView-heapBase), s.nodes, s.objects, s.objects+bare)

	rng := rand.New(rand.NewPCG(5, 6))
	zipf := rand.NewZipf(rng, 1.1, 1, uint64(s.tags-1))
	batchTags := make([]string, s.batch)
	for i := range batchTags {
		batchTags[i] = tagName(int(zipf.Uint64()))
	}
	// The claims' templates, one per tag, before anything is counted.
	for _, tag := range uniq(append(slices.Clone(batchTags), tagName(0))) {
		for _, ns := range []string{"claims", "single"} {
			createTemplate(t, ctx, c, mgr.GetCache(), ns, tag)
		}
	}
	place0 := histogram(t, controller.MetricPlacementSeconds)
	over0 := histogram(t, controller.MetricStartOverheadSeconds)

	// Phase 1: Sandboxes.
	req0 := apiserverRequests(t, ctx, cfg)
	sbRun := runBatch(t, ctx, c, s, "batch", batchTags, stand, false, func(i int, tag string) client.Object {
		return sandbox("batch", fmt.Sprintf("b-%05d", i), tag)
	})
	req1 := apiserverRequests(t, ctx, cfg)
	over1 := histogram(t, controller.MetricStartOverheadSeconds)
	// Phase 2: SandboxClaims of a template per tag.
	claimRun := runBatch(t, ctx, c, s, "claims", batchTags, stand, false, func(i int, tag string) client.Object {
		return claim("claims", fmt.Sprintf("c-%05d", i), tag)
	})
	req2 := apiserverRequests(t, ctx, cfg)
	over2 := histogram(t, controller.MetricStartOverheadSeconds)
	// Phase 3: claims one at a time, each of the most popular snapshot's
	// template, the next created once the last runs.
	singleRun := runBatch(t, ctx, c, s, "single", slices.Repeat([]string{tagName(0)}, s.single), stand, true, func(i int, tag string) client.Object {
		return claim("single", fmt.Sprintf("s-%05d", i), tag)
	})

	req3 := apiserverRequests(t, ctx, cfg)
	place := histogram(t, controller.MetricPlacementSeconds).minus(place0)
	over3 := histogram(t, controller.MetricStartOverheadSeconds)
	heapEnd := heapBytes()
	t.Logf("placement decisions (%s, %d in the batches): p50 ≤ %v, p99 ≤ %v (histogram bucket bounds)",
		controller.MetricPlacementSeconds, place.count, place.quantile(0.5), place.quantile(0.99))
	for _, ph := range []struct {
		what string
		h    hist
	}{{"Sandboxes at once", over1.minus(over0)}, {"claims at once", over2.minus(over1)}, {"claims one at a time", over3.minus(over2)}} {
		t.Logf("controller start overhead (%s), %s: %d, p50 ≤ %v, p99 ≤ %v",
			controller.MetricStartOverheadSeconds, ph.what, ph.h.count, ph.h.quantile(0.5), ph.h.quantile(0.99))
	}
	sbRun.log(t, "Sandboxes at once")
	claimRun.log(t, "SandboxClaims at once")
	singleRun.log(t, "SandboxClaims one at a time")
	t.Logf("apiserver requests per Sandbox (the test's create included): %s", req1.minus(req0).per(s.batch))
	t.Logf("apiserver requests per SandboxClaim (the test's create included): %s", req2.minus(req1).per(s.batch))
	t.Logf("apiserver requests per single SandboxClaim: %s", req3.minus(req2).per(s.single))
	t.Logf("heap in use after GC after the batches: %.1f MiB; goroutines %d", mib(heapEnd), runtime.NumGoroutine())

	checkPlacements(t, ctx, c, s, nodes, stand, bare)
	checkClaims(t, ctx, c, s.batch+s.single)
}
