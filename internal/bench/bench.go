// Package bench runs forkd's benchmarks (`forkd bench ...`) and writes
// their reports: a Markdown section to append to docs/BENCHMARKS.md, or
// with --json one JSON object carrying the same rows with their numbers.
//
// Each benchmark is one function taking the run's Config and its own
// options (Spawn, API, Branch, Chain, FirstAnswer, ImageFrom). Those that
// fork run an engine of their own, built by Config.NewEngine (the daemon's
// engine, which cmd/forkd assembles from its flags), in a run dir and
// network namespaces of their own, with a watchdog process that removes
// what the run owns however it ends (env.go, watchdog.go).
package bench

import (
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/state"
)

// Config is what every benchmark gets from the command that runs it.
type Config struct {
	// RunDir and DataDir are forkd's (--run-dir, --data-dir). A run keeps
	// its VMMs' files in RunDir/bench-NAME-PID and its state store in
	// DataDir/.bench-state-PID; snapshots it creates are the data dir's.
	RunDir, DataDir string
	// Version is forkd's, for the metrics and the API a run serves.
	Version string
	// PoolSize and PoolStartOnly are how the engine pools VMMs (--pool,
	// --pool-start-only); bench first-answer sets them per mode.
	PoolSize      int
	PoolStartOnly bool
	// Network is the default egress policy (--network), for the reports.
	Network string
	// NewEngine builds a run's engine: the daemon's, with these settings.
	NewEngine func(EngineOptions) (*sandbox.Engine, error)
	// Watchdog is the command line that runs Watchdog for this process
	// (`forkd ... bench watchdog --owner PID`); its fd 3 is the run's pipe.
	Watchdog []string
	// Progress receives progress lines ("bench: ..."); Out the report.
	Progress, Out io.Writer
	// JSON prints the report as JSON instead of Markdown (--json).
	JSON bool
}

// EngineOptions are what a run gives Config.NewEngine besides the flags.
type EngineOptions struct {
	RunDir      string
	NetNSPrefix string
	Log         *slog.Logger
	State       *state.Store
	Metrics     *metrics.Metrics // nil: no metrics
	// PoolSize and PoolStartOnly replace the flags' (Config's).
	PoolSize      int
	PoolStartOnly bool
}

// sayFunc writes one progress line.
type sayFunc func(format string, a ...any)

// newSay returns the progress writer of a run: lines prefixed "bench: ",
// one write each, safe for concurrent use (bench api's load clients).
func newSay(w io.Writer) sayFunc {
	if w == nil {
		w = io.Discard
	}
	var mu sync.Mutex
	return func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "bench: "+format+"\n", a...)
	}
}

// write prints r to the run's output: Markdown, or JSON with --json.
func (c Config) write(r *report) error { return r.write(c.Out, c.JSON) }
