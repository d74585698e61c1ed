package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// State is the engine's state at scrape time, returned by the function given
// to SetStateFunc.
type State struct {
	// SandboxesByState counts sandboxes by apiv1 state (starting, running, dead,
	// stopped); states missing from the map are reported as 0.
	SandboxesByState map[string]int
	// PooledVMMs counts the pre-started VMM processes ready in the pools,
	// by tag label (sandbox.MetricsTag: a template's tag, or BranchTag
	// for all branches together).
	PooledVMMs map[string]int
	// PoolSize is the number of VMMs each snapshot's pool is kept at
	// (--pool; 0: no pools).
	PoolSize int
	// Snapshots counts committed snapshot tags.
	Snapshots int
	// SnapshotBytes is the disk space the snapshots' files take (allocated
	// bytes, as apiv1.Snapshot.DiskBytes; memory images are sparse).
	SnapshotBytes int64
	// GuestMemoryBytes is the guest memory committed to sandboxes running
	// or starting and to pooled VMMs; GuestMemoryLimitBytes is the limit
	// past which forks are refused (0: none).
	GuestMemoryBytes, GuestMemoryLimitBytes int64
}

// knownStates are always reported, as 0 when absent, so a state's series
// does not vanish when its last sandbox goes.
var knownStates = apiv1.SandboxStates

// SetStateFunc sets the function read at every scrape for the state gauges
// (forkd_sandboxes, forkd_pooled_vmms, forkd_pool_size, forkd_snapshots,
// forkd_snapshot_bytes, forkd_guest_memory_*). It runs on the scraping
// goroutine, concurrently with everything else, so it must be safe for
// concurrent use; keep it cheap (no guest calls). Until it is set the
// state gauges are absent.
func (m *Metrics) SetStateFunc(f func() State) {
	if m == nil {
		return
	}
	if f == nil {
		m.state.Store(nil)
		return
	}
	m.state.Store(&f)
}

var (
	sandboxesDesc = prometheus.NewDesc("forkd_sandboxes",
		"Sandboxes the engine tracks, by state.", []string{"state"}, nil)
	pooledDesc = prometheus.NewDesc("forkd_pooled_vmms",
		"Pre-started VMM processes ready in the pools, by tag (a template's, or _branch for all branches).", []string{"tag"}, nil)
	poolSizeDesc = prometheus.NewDesc("forkd_pool_size",
		"VMMs each snapshot's pool is kept at (--pool; 0: no pools).", nil, nil)
	snapshotsDesc = prometheus.NewDesc("forkd_snapshots",
		"Committed snapshot tags.", nil, nil)
	snapshotBytesDesc = prometheus.NewDesc("forkd_snapshot_bytes",
		"Disk space allocated to snapshot files.", nil, nil)
	guestMemDesc = prometheus.NewDesc("forkd_guest_memory_committed_bytes",
		"Guest memory committed to running and starting sandboxes and to pooled VMMs (each guest's full size).", nil, nil)
	guestMemLimitDesc = prometheus.NewDesc("forkd_guest_memory_limit_bytes",
		"Committed guest memory past which forks are refused (--guest-memory-share; 0: no limit).", nil, nil)
)

// stateCollector reports State at scrape time.
type stateCollector struct{ m *Metrics }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, pooledDesc, poolSizeDesc, snapshotsDesc, snapshotBytesDesc, guestMemDesc, guestMemLimitDesc} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.state.Load()
	if f == nil {
		return
	}
	s := (*f)()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, st := range knownStates {
		if _, ok := s.SandboxesByState[st]; !ok {
			gauge(sandboxesDesc, 0, st)
		}
	}
	for st, n := range s.SandboxesByState {
		gauge(sandboxesDesc, float64(n), st)
	}
	// Tags past MaxTags add up under "other", as forkd_fork_ready_seconds
	// reports them.
	pooled := map[string]int{}
	for tag, n := range s.PooledVMMs {
		pooled[c.m.tags.admit(tag, MaxTags)] += n
	}
	for tag, n := range pooled {
		gauge(pooledDesc, float64(n), tag)
	}
	gauge(poolSizeDesc, float64(s.PoolSize))
	gauge(snapshotsDesc, float64(s.Snapshots))
	gauge(snapshotBytesDesc, float64(s.SnapshotBytes))
	gauge(guestMemDesc, float64(s.GuestMemoryBytes))
	gauge(guestMemLimitDesc, float64(s.GuestMemoryLimitBytes))
}
