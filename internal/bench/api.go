package bench

// forkd bench api: the API's overhead on exec, and exec under many
// concurrent API clients, through the daemon's API stack.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/api"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// APIOptions are bench api's flags.
type APIOptions struct {
	// Tag is the snapshot forked, created from Recipe if missing.
	Tag, Recipe string
	// Calls are the sequential calls per path for the overhead measure.
	Calls int
	// PortCalls are the sequential HTTP GETs per path for the port
	// proxy's overhead (0 skips it).
	PortCalls int
	// Clients are the concurrent API clients of the load (0 skips it),
	// spread over Sandboxes for Duration.
	Clients   int
	Sandboxes int
	Duration  time.Duration
	// SharedClient: all load clients share one API client (one HTTP
	// transport) instead of one each.
	SharedClient bool
	// NoAudit serves without the audit log (the daemon always has one).
	NoAudit bool
	// RequestTimeout fails a load request taking longer.
	RequestTimeout time.Duration
	// ShowErrors is how many first errors are printed.
	ShowErrors int
}

// apiRun is one run of bench api: an engine behind the daemon's API
// stack on a Unix socket.
type apiRun struct {
	e    *sandbox.Engine
	say  sayFunc
	m    *metrics.Metrics
	ln   *countingListener // the API's, counting connections
	sock string
	rep  *report
	argv []string // what every exec runs
}

// API runs bench api: the API's overhead on `exec true` (straight to the
// agent against the API's NDJSON stream and its buffered JSON answer,
// interleaved call by call; and the port proxy's on an HTTP GET), then
// exec under load: many API clients over a set of sandboxes.
func API(ctx context.Context, c Config, o APIOptions) error {
	if o.Calls < 0 || o.Clients < 0 || o.Sandboxes < 1 || o.Duration <= 0 {
		return fmt.Errorf("--calls and --clients must be >= 0, --sandboxes >= 1, --duration > 0: %w", errdefs.ErrInvalidArgument)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The daemon's stack: engine with a state store and metrics,
	// api.Server with metrics and an audit log, the daemon's HTTP server
	// (api.NewHTTPServer) on a Unix socket.
	m := metrics.New(c.Version)
	env, err := newEnv(c, "api", m)
	if err != nil {
		return err
	}
	defer env.close()
	e, runDir := env.e, env.runDir
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return err
	}
	srv := &api.Server{Engine: e, Version: c.Version, Log: log, Metrics: m}
	m.SetStateFunc(e.MetricsState)
	if !o.NoAudit {
		// Same filesystem as the daemon's audit log (DATA_DIR/audit), so its
		// per-record fsync costs what it costs there; removed at the end
		// (or by the next bench, after a SIGKILL: the pid is in the name).
		auditDir := dataDirOf(c.DataDir, "api-audit", os.Getpid())
		if err := os.Mkdir(auditDir, 0o700); err != nil {
			return err
		}
		defer os.RemoveAll(auditDir)
		alog, err := audit.Open(auditDir, audit.Options{Logger: log})
		if err != nil {
			return err
		}
		defer alog.Close()
		srv.Audit = alog
	}
	sock := filepath.Join(runDir, "api.sock")
	uln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	ln := &countingListener{Listener: uln}
	hs := api.NewHTTPServer(srv.Handler(), api.DefaultMaxConnections)
	go hs.Serve(ln)
	defer hs.Close() // runs before the engine closes: in-flight requests end first

	snap, err := env.ensureSnapshot(ctx, o.Tag, o.Recipe)
	if err != nil {
		return err
	}

	auditNote := "audit log on (fsync per request, as in the daemon)"
	if o.NoAudit {
		auditNote = "audit log off"
	}
	rep := newReport(ctx, e, "api", string(snap.VMM.Accel))
	rep.Setup = fmt.Sprintf("snapshot `%s` (recipe %s, %d MiB, %d vCPU); pool %d; API on a Unix socket, %s",
		snap.Tag, snap.Image.Recipe, snap.MemoryMiB, snap.VCPUs, c.PoolSize, auditNote)
	r := &apiRun{e: e, say: env.say, m: m, ln: ln, sock: sock, rep: rep, argv: []string{"true"}}
	if o.Calls > 0 {
		env.waitPool(snap.ID, c.PoolSize, poolWait)
		if err := r.overhead(ctx, o); err != nil {
			return err
		}
	}
	var loadFailures int64
	if o.Clients > 0 {
		env.waitPool(snap.ID, c.PoolSize, poolWait)
		if loadFailures, err = r.load(ctx, o); err != nil {
			return err
		}
	}
	if err := c.write(rep); err != nil {
		return err
	}
	if loadFailures > 0 {
		return fmt.Errorf("bench api: %d load requests failed (see the report): %w", loadFailures, errdefs.ErrUnavailable)
	}
	return nil
}

// pcts are the p50 / p90 / p99 of ms, as the report's text and numbers.
func pcts(ms []float64) (string, vals) {
	p50, p90, p99 := percentile(ms, 0.5), percentile(ms, 0.9), percentile(ms, 0.99)
	return fmt.Sprintf("%.2f / %.2f / %.2f ms", p50, p90, p99), vals{"p50_ms": p50, "p90_ms": p90, "p99_ms": p99}
}

// overhead forks one sandbox and runs o.Calls `exec true` on each of
// three paths, interleaved call by call: straight to the agent, through
// the API with the CLI's client (NDJSON stream), and through the API with
// the buffered JSON answer; then the port proxy's overhead.
func (r *apiRun) overhead(ctx context.Context, o APIOptions) error {
	e, argv := r.e, r.argv
	sbs, err := e.Fork(ctx, o.Tag, 1)
	if err != nil {
		return err
	}
	id := sbs[0].ID
	agent, err := e.Agent(id)
	if err != nil {
		return err
	}
	cl := client.New(r.sock)
	raw := unixHTTPClient(r.sock)
	paths := []struct {
		name  string
		call  func() error
		ms    []float64
		conns int64
	}{
		{name: "agent", call: func() error {
			ev, err := agent.Exec(ctx, agentapi.ExecRequest{Argv: argv}, nil, io.Discard, io.Discard)
			if err == nil && ev.ExitCode != 0 {
				err = fmt.Errorf("exit code %d", ev.ExitCode)
			}
			return err
		}},
		{name: "api-ndjson", call: func() error {
			ev, err := cl.Exec(ctx, id, apiv1.ExecRequest{Argv: argv}, nil, io.Discard, io.Discard)
			if err == nil && ev.ExitCode != 0 {
				err = fmt.Errorf("exit code %d", ev.ExitCode)
			}
			return err
		}},
		{name: "api-json", call: func() error {
			res, err := rawExecJSON(ctx, raw, id, argv)
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit code %d", res.ExitCode)
			}
			return err
		}},
	}
	// Warm up every path (first connections, page faults in the guest).
	for i := 0; i < 5; i++ {
		for _, p := range paths {
			if err := p.call(); err != nil {
				return fmt.Errorf("warm-up exec via %s: %w", p.name, err)
			}
		}
	}
	r.say("overhead: %d sequential `exec true` per path, interleaved", o.Calls)
	for i := 0; i < o.Calls; i++ {
		// Rotate the order so no path always runs right after another.
		for k := range paths {
			p := &paths[(i+k)%len(paths)]
			c0 := r.ln.n.Load()
			start := time.Now()
			if err := p.call(); err != nil {
				return fmt.Errorf("exec via %s (call %d): %w", p.name, i+1, err)
			}
			p.ms = append(p.ms, millis(time.Since(start)))
			p.conns += r.ln.n.Load() - c0
		}
	}
	if o.PortCalls > 0 {
		if err := portProxy(ctx, e, id, r.sock, o.PortCalls, r.rep.row, r.say); err != nil {
			return err
		}
	}
	e.Kill(ctx, []string{id})
	agentMs, ndjsonMs, jsonMs := paths[0].ms, paths[1].ms, paths[2].ms
	a50 := percentile(agentMs, 0.5)
	d1, d2 := percentile(ndjsonMs, 0.5)-a50, percentile(jsonMs, 0.5)-a50
	r.say("overhead: agent p50 %.2f ms, API NDJSON p50 %.2f ms (+%.2f), API JSON p50 %.2f ms (+%.2f)", a50, percentile(ndjsonMs, 0.5), d1, percentile(jsonMs, 0.5), d2)
	verdict := func(d float64) string {
		if d <= 5 {
			return "within the 5 ms target"
		}
		return "**over the 5 ms target**"
	}
	row := r.rep.row
	text, v := pcts(agentMs)
	row(fmt.Sprintf("`exec true` straight to the agent, %d sequential, p50 / p90 / p99", o.Calls), text, v)
	text, v = pcts(ndjsonMs)
	row(fmt.Sprintf("`exec true` through the API, NDJSON stream (internal/client, the CLI), %d sequential, p50 / p90 / p99", o.Calls), text, v)
	text, v = pcts(jsonMs)
	row(fmt.Sprintf("`exec true` through the API, buffered JSON (Accept: application/json), %d sequential, p50 / p90 / p99", o.Calls), text, v)
	row("API overhead at p50, NDJSON / buffered JSON", fmt.Sprintf("%+.2f ms / %+.2f ms (%s / %s)", d1, d2, verdict(d1), verdict(d2)), vals{"ndjson_ms": d1, "json_ms": d2})
	row(fmt.Sprintf("new API connections over the %d calls, NDJSON / buffered JSON", o.Calls), fmt.Sprintf("%d / %d", paths[1].conns, paths[2].conns),
		vals{"ndjson": float64(paths[1].conns), "json": float64(paths[2].conns)})
	return nil
}
