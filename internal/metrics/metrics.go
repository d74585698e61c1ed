// Package metrics is forkd's Prometheus instrumentation: one Metrics value
// per daemon, owning a private registry (never the global one), served at
// /metrics.
//
// The engine and the API call typed Observe methods at the points where they
// already measure time or see an outcome; gauges that describe the engine's
// current state (sandboxes by state, pooled VMMs, snapshots, guest memory)
// and the free space of the daemon's file systems are not pushed but read at
// scrape time, so they can never go stale. Every method is safe for
// concurrent use and a no-op on a nil *Metrics, so code under test can run
// without instrumentation.
//
// Names carry the forkd_ prefix and their unit (_seconds, _bytes). Label
// values come from bounded sets, never from raw request paths, sandbox ids,
// tenant names or error texts; labels.go says why each one is bounded.
// packaging/monitoring holds the scrape example, alert rules and Grafana
// dashboard built on these names (dashboards_test.go checks each name they
// use exists).
package metrics

import (
	"encoding/json"
	"net/http"
	"runtime"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/forkd-dev/forkd/internal/apiv1"
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

// Metrics holds forkd's collectors and their registry.
type Metrics struct {
	reg *prometheus.Registry
	// collectors is everything registered in reg (register): what
	// they describe is every family the daemon can export, whether it
	// has a series yet or not (the dashboards test checks names
	// against it).
	collectors []prometheus.Collector

	forkReady          *prometheus.HistogramVec
	forkRequests       *prometheus.CounterVec
	vmmPhase           *prometheus.HistogramVec
	poolRefillFailures *prometheus.CounterVec
	poolHandOuts       *prometheus.CounterVec
	branchPause        *prometheus.HistogramVec
	branchBytes        *prometheus.CounterVec
	agentRPC           *prometheus.HistogramVec
	agentRPCErrors     *prometheus.CounterVec
	requests           *prometheus.HistogramVec
	auditFailures      prometheus.Counter
	sandboxEvents      *prometheus.CounterVec
	poolStopped        *prometheus.CounterVec

	state       atomic.Pointer[func() State]
	filesystems atomic.Pointer[[]Filesystem]

	// Guards on label cardinality (labels.go).
	routes, ops, tags labelSet
}

func latency(name, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: LatencyBuckets}, labels)
}

func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// New returns a Metrics with its own registry holding forkd's metrics, the
// Go runtime and process collectors, and forkd_build_info{version,go_version}.
func New(version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		forkReady: latency("forkd_fork_ready_seconds",
			"Fork-to-ready latency of one sandbox: from taking a VMM to its agent answering. tag is the template's tag, or _branch for every snapshot taken of a running sandbox.", "tag", "pooled"),
		forkRequests: counter("forkd_fork_requests_total",
			"Fork requests (one per request, whatever its count of children), by result: ok, or the error class that failed it.", "result"),
		vmmPhase: latency("forkd_vmm_phase_seconds",
			"Duration of VMM start-up phases (prepare, restore, boot, snapshot_save).", "phase"),
		poolRefillFailures: counter("forkd_pool_refill_failures_total",
			"Pool refills that stopped before the pool was full, by error class (resource_exhausted: the guest memory limit left no room).", "code"),
		poolHandOuts: counter("forkd_pool_handout_failures_total",
			"Children restored ahead in a pool whose hand-out failed (their guest stopped answering while pooled), by error class; each fork went on with a child restored then.", "code"),
		branchPause: latency("forkd_branch_pause_seconds",
			"How long a running sandbox was paused to branch it.", "mode"),
		branchBytes: counter("forkd_branch_written_bytes_total",
			"Bytes branches wrote (memory pages and device state), by mode.", "mode"),
		agentRPC: latency("forkd_agent_rpc_duration_seconds",
			"Latency of host-to-agent calls, to the response header for streaming calls.", "op"),
		agentRPCErrors: counter("forkd_agent_rpc_errors_total",
			"Failed host-to-agent calls, by operation and error class.", "op", "code"),
		requests: latency("forkd_http_request_duration_seconds",
			"API request duration by route pattern, method and status code.", "route", "method", "code"),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "forkd_audit_write_failures_total",
			Help: "Audit records that could not be written; while writes fail, mutating API requests are refused (503).",
		}),
		sandboxEvents: counter("forkd_sandbox_events_total",
			"Sandbox lifecycle events: created, failed (asked of a fork that failed), expired (timeout or idle timeout), died (VMM exited on its own), killed (on request).", "event"),
		poolStopped: counter("forkd_pool_vmms_stopped_total",
			"Waiting pooled VMMs stopped by forkd, by reason: idle (no fork took from the pool for --pool-idle), shrunk (a pool grown by a fan-out went back to --pool), evicted (a fork needed their guest memory).", "reason"),
	}
	for _, ev := range SandboxEvents {
		m.sandboxEvents.WithLabelValues(ev)
	}
	for _, r := range PoolStopReasons {
		m.poolStopped.WithLabelValues(r)
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "forkd_build_info",
		Help:        "Always 1; labels say which forkd build is running.",
		ConstLabels: prometheus.Labels{"version": version, "go_version": runtime.Version()},
	})
	buildInfo.Set(1)
	m.register(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo,
		m.forkReady, m.forkRequests, m.vmmPhase, m.poolRefillFailures, m.poolHandOuts, m.branchPause, m.branchBytes,
		m.agentRPC, m.agentRPCErrors, m.requests, m.auditFailures, m.sandboxEvents, m.poolStopped,
		stateCollector{m}, filesystemCollector{m},
	)
	return m
}

// register registers cs and remembers them in m.collectors.
func (m *Metrics) register(cs ...prometheus.Collector) {
	m.reg.MustRegister(cs...)
	m.collectors = append(m.collectors, cs...)
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
