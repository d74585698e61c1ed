package sandbox

import (
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// MetricsTag is the tag label a snapshot's forks and pooled VMMs are
// reported under: its tag for a template, metrics.BranchTag for a
// snapshot taken of a running sandbox (and for what was compacted or
// imported from one). SDKs name each branch afresh (<tag>-br-<random>),
// so branch tags as label values would grow a series per branch.
func MetricsTag(snap *snapshot.Snapshot) string {
	if snap.Branch != nil {
		return metrics.BranchTag
	}
	return snap.Tag
}

// MetricsState is what /metrics reports about the engine, read at every
// scrape (metrics.Metrics.SetStateFunc): cheap, no guest calls.
func (e *Engine) MetricsState() metrics.State {
	st := metrics.State{SandboxesByState: map[string]int{}, PooledVMMs: map[string]int{}, PoolSize: e.cfg.PoolSize}
	for _, sb := range e.List() {
		st.SandboxesByState[sb.State()]++
	}
	committed, limit := e.GuestMemory()
	st.GuestMemoryBytes, st.GuestMemoryLimitBytes = committed<<20, limit<<20
	snaps, _ := e.store.List()
	st.Snapshots = len(snaps)
	for _, snap := range snaps {
		// Every snapshot's tag label is reported, 0 when its pool is
		// empty or not started, so an empty pool is a series at 0.
		st.PooledVMMs[MetricsTag(snap)] += e.PoolSize(snap.ID)
		st.SnapshotBytes += snapshotBytes(snap) // allocated: memory files are sparse
	}
	return st
}
