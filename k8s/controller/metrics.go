package controller

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/placement"
)

// The controller's own metrics, registered in controller-runtime's
// registry (served on the manager's metrics address beside
// controller_runtime_*). docs/SCALE.md gives the targets they check.
const (
	// MetricPlacementSeconds is a histogram of each placement decision
	// (placement.Cluster.Place: pick a node and reserve its memory),
	// labelled result: holder (a node holding the snapshot), pull (a node
	// that pulls it first), no_capacity, error. Pinned sandboxes
	// (spec.nodeName) make no decision and are not counted.
	MetricPlacementSeconds = "forkd_controller_placement_duration_seconds"
	// MetricStartOverheadSeconds is a histogram of what the controller
	// adds to a fork: from the placement decision to the Running status
	// written, less the fork time the node reports (ForkResponse
	// total_ms), labelled pull (true: the node pulled the snapshot
	// first). It holds the Placed status write (none for a Sandbox its
	// claim created bound, see Preplace: then the Create instead), the
	// fork request's round trip and the Running status write; not the
	// wait in the work queue before the decision. A sandbox placed by an
	// earlier controller, or pinned by its author, is not counted.
	MetricStartOverheadSeconds = "forkd_controller_sandbox_start_overhead_seconds"
)

var (
	placementSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: MetricPlacementSeconds,
		Help: "Duration of one placement decision (pick a node and reserve its memory).",
		// 1 µs to 134 ms by doubling: a decision is microseconds, the
		// target (p99 10 ms) sits between two buckets.
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 18),
	}, []string{"result"})
	startOverheadSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: MetricStartOverheadSeconds,
		Help: "From a sandbox's placement decision to its Running status written, less the node's reported fork time.",
		// 1 ms to 16 s by doubling (the target, 50 ms, between two).
		Buckets: prometheus.ExponentialBuckets(1e-3, 2, 15),
	}, []string{"pull"})
)

func init() {
	metrics.Registry.MustRegister(placementSeconds, startOverheadSeconds)
}

// Placement results, the values of MetricPlacementSeconds' label.
const (
	placeHolder     = "holder"
	placePull       = "pull"
	placeNoCapacity = "no_capacity"
	placeError      = "error"
)

// placeTimed is Cluster.Place, timed into MetricPlacementSeconds. It
// returns when the decision began: the caller starts the sandbox's clock
// for MetricStartOverheadSeconds (starts.begin) once it knows its UID.
func (r *SandboxReconciler) placeTimed(req placement.Request) (placement.Decision, time.Time, error) {
	began := time.Now()
	d, err := r.Cluster.Place(req)
	took := time.Since(began)
	result := placeHolder
	switch {
	case errors.Is(err, placement.ErrPlaced):
		return d, began, err // no decision made
	case errors.Is(err, placement.ErrNoCapacity):
		result = placeNoCapacity
	case err != nil:
		result = placeError
	case d.Pull:
		result = placePull
	}
	placementSeconds.WithLabelValues(result).Observe(took.Seconds())
	return d, began, err
}

// observeRunning ends a sandbox's clock once its Running status is
// written: forkMs is the fork time its node reported.
func observeRunning(sb *v1.Sandbox, forkMs float64) {
	s, ok := starts.end(sb.UID)
	if !ok {
		return
	}
	overhead := time.Since(s.at).Seconds() - forkMs/1000
	startOverheadSeconds.WithLabelValues(strconv.FormatBool(s.pull)).Observe(max(overhead, 0))
}

// startClocks holds when each sandbox was placed, by UID, until it runs.
// A sandbox deleted before it runs leaves its entry; entries older than
// startClockMaxAge are dropped every startClockSweep decisions, so the map
// stays at about the sandboxes placed in that time.
type startClocks struct {
	mu    sync.Mutex
	at    map[types.UID]startClock
	added int
}

type startClock struct {
	at   time.Time
	pull bool
}

const (
	startClockMaxAge = time.Hour
	startClockSweep  = 4096
)

var starts = &startClocks{at: map[types.UID]startClock{}}

func (s *startClocks) begin(uid types.UID, at time.Time, pull bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[uid]; ok {
		return // placed again after a failed status write: the first counts
	}
	s.at[uid] = startClock{at: at, pull: pull}
	if s.added++; s.added%startClockSweep == 0 {
		for k, v := range s.at {
			if time.Since(v.at) > startClockMaxAge {
				delete(s.at, k)
			}
		}
	}
}

func (s *startClocks) end(uid types.UID) (startClock, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.at[uid]
	delete(s.at, uid)
	return c, ok
}
