// Package metrics is forkd's Prometheus instrumentation: one Metrics value
// per daemon, owning a private registry (never the global one), served at
// /metrics.
//
// The engine and the API call typed Observe methods at the points where they
// already measure time; gauges that describe the engine's current state
// (sandboxes by state, pooled VMMs, snapshots) are not pushed but read from a
// callback at scrape time, so they can never go stale. Every method is safe
// for concurrent use and a no-op on a nil *Metrics, so code under test can
// run without instrumentation.
//
// Names carry the forkd_ prefix and their unit (_seconds, _bytes). Label
// values come from bounded sets (route patterns, phases, error classes,
// snapshot tags), never from raw request paths or sandbox ids.
package metrics

import (
	"encoding/json"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// LatencyBuckets are the histogram bounds, in seconds, of every latency
// metric: 1 ms to 60 s, about 2.5x apart. Forks land in the 5-500 ms range
// with KVM and in seconds under TCG; template boots and saves take seconds.
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// VMM phases for ObserveVMMStart.
const (
	// PhasePrepare: network namespace, VMM process waiting for its
	// incoming state, agent socket connected (pool refills and cold forks).
	PhasePrepare = "prepare"
	// PhaseRestore: loading a snapshot's device state into a prepared VMM.
	PhaseRestore = "restore"
	// PhaseBoot: a template's cold boot until its agent answers.
	PhaseBoot = "boot"
	// PhaseSnapshotSave: saving a template's device state.
	PhaseSnapshotSave = "snapshot_save"
)

// State is the engine's state at scrape time, returned by the function given
// to SetStateFunc.
type State struct {
	// SandboxesByState counts sandboxes by apiv1 state (starting, running, dead,
	// stopped); states missing from the map are reported as 0.
	SandboxesByState map[string]int
	// PooledVMMs counts pre-started VMM processes waiting in the pools.
	PooledVMMs int
	// Snapshots counts committed snapshot tags.
	Snapshots int
	// SnapshotBytes is the disk space the snapshots' files take (allocated
	// bytes, as apiv1.Snapshot.DiskBytes; memory images are sparse).
	SnapshotBytes int64
}

// knownStates are always reported, as 0 when absent, so a state's series
// does not vanish when its last sandbox goes.
var knownStates = apiv1.SandboxStates

// Metrics holds forkd's collectors and their registry.
type Metrics struct {
	reg *prometheus.Registry

	forkReady      *prometheus.HistogramVec
	vmmPhase       *prometheus.HistogramVec
	branchPause    *prometheus.HistogramVec
	branchBytes    *prometheus.CounterVec
	agentRPC       *prometheus.HistogramVec
	agentRPCErrors *prometheus.CounterVec
	requests       *prometheus.HistogramVec
	auditFailures  prometheus.Counter
	sandboxEvents  *prometheus.CounterVec

	state atomic.Pointer[func() State]

	// Guards on label cardinality.
	routes, ops, tags labelSet
}

// Bounds on distinct label values; values past them are reported as
// "other". They are far above what forkd produces and only guard against a
// caller passing unbounded values (raw paths, file names).
const (
	MaxRoutes = 200  // route of forkd_http_request_duration_seconds
	MaxOps    = 100  // op of forkd_agent_rpc_*
	MaxTags   = 1000 // tag of forkd_fork_ready_seconds
)

// labelSet admits the first max distinct values of a label.
type labelSet struct {
	seen sync.Map // value -> struct{}
	n    atomic.Int64
}

func (l *labelSet) admit(v string, max int64) string {
	if _, ok := l.seen.Load(v); ok {
		return v
	}
	if l.n.Add(1) > max {
		l.n.Add(-1)
		return "other"
	}
	if _, loaded := l.seen.LoadOrStore(v, struct{}{}); loaded {
		l.n.Add(-1)
	}
	return v
}

func latency(name, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: LatencyBuckets}, labels)
}

// New returns a Metrics with its own registry holding forkd's metrics, the
// Go runtime and process collectors, and forkd_build_info{version,go_version}.
func New(version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		forkReady: latency("forkd_fork_ready_seconds",
			"Fork-to-ready latency of one sandbox: from taking a VMM to its agent answering.", "tag", "pooled"),
		vmmPhase: latency("forkd_vmm_phase_seconds",
			"Duration of VMM start-up phases (prepare, restore, boot, snapshot_save).", "phase"),
		branchPause: latency("forkd_branch_pause_seconds",
			"How long a running sandbox was paused to branch it.", "mode"),
		branchBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkd_branch_written_bytes_total",
			Help: "Bytes branches wrote (memory pages and device state), by mode.",
		}, []string{"mode"}),
		agentRPC: latency("forkd_agent_rpc_duration_seconds",
			"Latency of host-to-agent calls, to the response header for streaming calls.", "op"),
		agentRPCErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkd_agent_rpc_errors_total",
			Help: "Failed host-to-agent calls, by operation and error class.",
		}, []string{"op", "code"}),
		requests: latency("forkd_http_request_duration_seconds",
			"API request duration by route pattern, method and status code.", "route", "method", "code"),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "forkd_audit_write_failures_total",
			Help: "Audit records that could not be written; while writes fail, mutating API requests are refused (503).",
		}),
		sandboxEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkd_sandbox_events_total",
			Help: "Sandbox lifecycle events: created, failed (asked of a fork that failed), expired (timeout or idle timeout), died (VMM exited on its own), killed (on request).",
		}, []string{"event"}),
	}
	for _, ev := range SandboxEvents {
		m.sandboxEvents.WithLabelValues(ev)
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "forkd_build_info",
		Help:        "Always 1; labels say which forkd build is running.",
		ConstLabels: prometheus.Labels{"version": version, "go_version": runtime.Version()},
	})
	buildInfo.Set(1)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo,
		m.forkReady, m.vmmPhase, m.branchPause, m.branchBytes, m.agentRPC, m.agentRPCErrors, m.requests, m.auditFailures, m.sandboxEvents,
		stateCollector{m},
	)
	return m
}

// Registry returns the registry, for tests and for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text (or OpenMetrics, when
// asked for) exposition format. On a nil *Metrics it answers 404 with a
// problem, so routes can be registered whether or not metrics are on.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(apiv1.Problem{
				Type: "https://forkd.dev/problems/not_found", Title: http.StatusText(http.StatusNotFound),
				Status: http.StatusNotFound, Detail: "metrics are not enabled in this daemon", Code: "not_found",
				RequestID: w.Header().Get("X-Request-Id"),
			})
		})
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// ObserveForkReady records one sandbox's fork-to-ready time (the value of
// apiv1.Sandbox.ReadyMillis). pooled says whether a pre-started VMM was used.
func (m *Metrics) ObserveForkReady(tag string, pooled bool, d time.Duration) {
	if m == nil {
		return
	}
	m.forkReady.WithLabelValues(m.tags.admit(tag, MaxTags), strconv.FormatBool(pooled)).Observe(d.Seconds())
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
		m.agentRPCErrors.WithLabelValues(op, errdefs.Code(err)).Inc()
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

func boundMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

// ObserveAuditWriteFailure counts an audit record that could not be
// written.
func (m *Metrics) ObserveAuditWriteFailure() {
	if m == nil {
		return
	}
	m.auditFailures.Inc()
}

// SetStateFunc sets the function read at every scrape for the state gauges
// (forkd_sandboxes, forkd_pooled_vmms, forkd_snapshots,
// forkd_snapshot_bytes). It runs on the scraping goroutine, concurrently
// with everything else, so it must be safe for concurrent use; keep it cheap
// (no guest calls). Until it is set the state gauges are absent.
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
		"Pre-started VMM processes waiting in the pools.", nil, nil)
	snapshotsDesc = prometheus.NewDesc("forkd_snapshots",
		"Committed snapshot tags.", nil, nil)
	snapshotBytesDesc = prometheus.NewDesc("forkd_snapshot_bytes",
		"Disk space allocated to snapshot files.", nil, nil)
)

// stateCollector reports State at scrape time.
type stateCollector struct{ m *Metrics }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- pooledDesc
	ch <- snapshotsDesc
	ch <- snapshotBytesDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.state.Load()
	if f == nil {
		return
	}
	s := (*f)()
	for _, st := range knownStates {
		if _, ok := s.SandboxesByState[st]; !ok {
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, 0, st)
		}
	}
	for st, n := range s.SandboxesByState {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), st)
	}
	ch <- prometheus.MustNewConstMetric(pooledDesc, prometheus.GaugeValue, float64(s.PooledVMMs))
	ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.GaugeValue, float64(s.Snapshots))
	ch <- prometheus.MustNewConstMetric(snapshotBytesDesc, prometheus.GaugeValue, float64(s.SnapshotBytes))
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
