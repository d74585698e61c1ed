package metrics

import (
	"strconv"
	"time"
)

// ObserveForkReady records one sandbox's fork-to-ready time (the value of
// apiv1.Sandbox.ReadyMillis). tag is the snapshot's tag label: its tag for
// a template, BranchTag for a branch (sandbox.MetricsTag); pooled says
// whether a pre-started VMM was used.
func (m *Metrics) ObserveForkReady(tag string, pooled bool, d time.Duration) {
	if m == nil {
		return
	}
	m.forkReady.WithLabelValues(m.tags.admit(tag, MaxTags), strconv.FormatBool(pooled)).Observe(d.Seconds())
}

// ObserveForkRequest records the outcome of one fork request: err nil is
// result="ok", else its error class.
func (m *Metrics) ObserveForkRequest(err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = errorClass(err)
	}
	m.forkRequests.WithLabelValues(result).Inc()
}

// ObservePoolRefillFailure counts a pool refill that stopped before its
// pool was full, under err's error class.
func (m *Metrics) ObservePoolRefillFailure(err error) {
	if m == nil {
		return
	}
	m.poolRefillFailures.WithLabelValues(errorClass(err)).Inc()
}

// ObservePoolHandOutFailure counts a child restored ahead whose hand-out
// failed, under err's error class.
func (m *Metrics) ObservePoolHandOutFailure(err error) {
	if m == nil {
		return
	}
	m.poolHandOuts.WithLabelValues(errorClass(err)).Inc()
}

// ObserveVMMStart records one VMM start-up phase (PhasePrepare, ...).
func (m *Metrics) ObserveVMMStart(phase string, d time.Duration) {
	if m == nil {
		return
	}
	m.vmmPhase.WithLabelValues(phase).Observe(d.Seconds())
}

// ObserveBranch records how long a sandbox was paused to branch it and
// what the branch wrote; mode names the branch strategy (a small fixed set).
func (m *Metrics) ObserveBranch(mode string, paused time.Duration, written int64) {
	if m == nil {
		return
	}
	m.branchPause.WithLabelValues(mode).Observe(paused.Seconds())
	m.branchBytes.WithLabelValues(mode).Add(float64(written))
}

// ObserveAgentRPC records one host-to-agent call; a non-nil err also counts
// as an error under its errdefs class code. op must come from a fixed set
// (the agent API's method and path, "GET /v1/files/stat"), never include a
// file name.
func (m *Metrics) ObserveAgentRPC(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	op = m.ops.admit(op, MaxOps)
	m.agentRPC.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.agentRPCErrors.WithLabelValues(op, errorClass(err)).Inc()
	}
}

// ObserveRequest records one API request. route must be a registered
// pattern, never the raw path. As a guard on cardinality, methods outside
// the standard set are reported as "other", and so are routes past the
// first MaxRoutes distinct ones.
func (m *Metrics) ObserveRequest(route, method string, status int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(m.routes.admit(route, MaxRoutes), boundMethod(method), strconv.Itoa(status)).Observe(d.Seconds())
}

// ObserveAuditWriteFailure counts an audit record that could not be
// written.
func (m *Metrics) ObserveAuditWriteFailure() {
	if m == nil {
		return
	}
	m.auditFailures.Inc()
}

// Sandbox lifecycle events, the values of forkd_sandbox_events_total's
// event label.
const (
	SandboxCreated = "created" // a fork answered with it
	SandboxFailed  = "failed"  // asked of a fork that failed
	SandboxExpired = "expired" // its timeout or idle timeout ended it
	SandboxDied    = "died"    // its VMM exited on its own
	SandboxKilled  = "killed"  // killed on request
)

// SandboxEvents lists every event label value; each series exists from
// the start, at 0.
var SandboxEvents = []string{SandboxCreated, SandboxFailed, SandboxExpired, SandboxDied, SandboxKilled}

// ObserveSandboxEvent counts one sandbox lifecycle event (SandboxCreated, ...).
func (m *Metrics) ObserveSandboxEvent(event string) { m.ObserveSandboxEvents(event, 1) }

// ObserveSandboxEvents counts n sandboxes reaching event.
func (m *Metrics) ObserveSandboxEvents(event string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.sandboxEvents.WithLabelValues(event).Add(float64(n))
}

// Reasons a waiting pooled VMM is stopped (forkd_pool_vmms_stopped_total).
const (
	PoolStopIdle    = "idle"    // its pool went unused for --pool-idle
	PoolStopShrunk  = "shrunk"  // its pool, grown by a fan-out, went back to --pool
	PoolStopEvicted = "evicted" // a fork needed its guest memory
)

// PoolStopReasons are the reason label's values.
var PoolStopReasons = []string{PoolStopIdle, PoolStopShrunk, PoolStopEvicted}

// ObservePoolStopped counts n waiting pooled VMMs stopped for reason.
func (m *Metrics) ObservePoolStopped(reason string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.poolStopped.WithLabelValues(reason).Add(float64(n))
}
