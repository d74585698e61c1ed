package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/api"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

type benchAPIOpts struct {
	tag, recipe     string
	calls           int
	portCalls       int
	clients         int
	sandboxes       int
	duration        time.Duration
	sharedClient    bool
	noAudit         bool
	requestTimeout  time.Duration
	maxErrorsToShow int
}

func benchAPICmd(g *globals) *cobra.Command {
	var o benchAPIOpts
	cmd := &cobra.Command{
		Use:   "api",
		Short: "API overhead on exec and exec under many concurrent API clients (runs its own engine and API server; needs root)",
		Long: "Runs an engine in-process (its own run dir and namespaces, the shared data dir) behind the\n" +
			"daemon's API stack (api.Server with metrics and an audit log, served on a Unix socket in\n" +
			"its run dir) and measures, in one run:\n" +
			"  - the API's overhead: --calls sequential `exec true` in one sandbox, straight to the\n" +
			"    agent, through the API with the CLI's client (NDJSON stream), and through the API\n" +
			"    with the buffered JSON answer (Accept: application/json), interleaved call by call;\n" +
			"  - exec under load: --clients concurrent API clients looping `exec true` over\n" +
			"    --sandboxes sandboxes for --duration; requests, failures, latency and throughput.\n" +
			"Prints a Markdown report (append it to docs/BENCHMARKS.md), or with --json the same rows\n" +
			"with their numbers as one JSON object; progress goes to stderr.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchAPI(cmd.Context(), g, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.tag, "tag", "bench-minimal", "snapshot to fork (created from --recipe if missing)")
	f.StringVar(&o.recipe, "recipe", "minimal", "recipe for a missing --tag")
	f.IntVar(&o.calls, "calls", 200, "sequential calls per path for the overhead measure")
	f.IntVar(&o.portCalls, "port-calls", 200, "sequential HTTP GETs per path for the port proxy's overhead (0 skips it)")
	f.IntVar(&o.clients, "clients", 200, "concurrent API clients in the load measure (0 skips it)")
	f.IntVar(&o.sandboxes, "sandboxes", 20, "sandboxes the load is spread over")
	f.DurationVar(&o.duration, "duration", 30*time.Second, "how long clients keep issuing requests")
	f.BoolVar(&o.sharedClient, "shared-client", false, "all load clients share one API client (one HTTP transport) instead of one each")
	f.BoolVar(&o.noAudit, "no-audit", false, "serve without the audit log (the daemon always has one)")
	f.DurationVar(&o.requestTimeout, "request-timeout", 2*time.Minute, "a load request taking longer fails")
	f.IntVar(&o.maxErrorsToShow, "show-errors", 5, "first errors printed")
	addPoolFlags(f, g, "pre-started VMMs per snapshot")
	addDriverFlags(f, g, "")
	return cmd
}

// latencies collects request durations (ms) from many goroutines.
type latencies struct {
	mu sync.Mutex
	ms []float64
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ms = append(l.ms, float64(d.Microseconds())/1000)
	l.mu.Unlock()
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		if x > m {
			m = x
		}
	}
	return m
}

func meanOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// rawExecJSON is exec through the API with the buffered answer format
// (Accept: application/json), the way a plain HTTP client (curl, an SDK
// without streaming) calls it. It reads the body to the end, so the
// connection is reused.
func rawExecJSON(ctx context.Context, hc *http.Client, id string, argv []string) (apiv1.ExecResult, error) {
	var res apiv1.ExecResult
	hdr, err := json.Marshal(apiv1.ExecRequest{Argv: argv})
	if err != nil {
		return res, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://forkd/v1/sandboxes/"+url.PathEscape(id)+"/exec", http.NoBody)
	if err != nil {
		return res, err
	}
	req.Header.Set(apiv1.ExecHeader, string(hdr))
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return res, err
	}
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return res, fmt.Errorf("decode exec result: %w", err)
	}
	return res, nil
}

// histogram returns the sum (seconds) and count of the observations of the
// histogram name whose labels include every pair in match.
func histogram(m *metrics.Metrics, name string, match map[string]string) (sum float64, count uint64) {
	mfs, err := m.Registry().Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			n := 0
			for _, lp := range mt.GetLabel() {
				if v, ok := match[lp.GetName()]; ok && v == lp.GetValue() {
					n++
				}
			}
			if n == len(match) {
				sum += mt.GetHistogram().GetSampleSum()
				count += mt.GetHistogram().GetSampleCount()
			}
		}
	}
	return sum, count
}

// countingListener counts accepted connections, to show whether clients
// reuse them.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func unixHTTPClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 64,
	}}
}

func runBenchAPI(ctx context.Context, g *globals, o benchAPIOpts) error {
	if o.calls < 0 || o.clients < 0 || o.sandboxes < 1 || o.duration <= 0 {
		return fmt.Errorf("--calls and --clients must be >= 0, --sandboxes >= 1, --duration > 0: %w", errdefs.ErrInvalidArgument)
	}
	say := benchSay
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The daemon's stack: engine with a state store and metrics,
	// api.Server with metrics and an audit log, the daemon's HTTP server
	// (api.NewHTTPServer) on a Unix socket.
	m := metrics.New(version)
	env, err := newBenchEnv(g, "api", m)
	if err != nil {
		return err
	}
	defer env.close()
	e, runDir := env.e, env.runDir
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return err
	}
	srv := &api.Server{Engine: e, Version: version, Log: log, Metrics: m}
	m.SetStateFunc(e.MetricsState)
	var auditDir string
	if !o.noAudit {
		// Same filesystem as the daemon's audit log (DATA_DIR/audit), so its
		// per-record fsync costs what it costs there; removed at the end
		// (or by the next bench, after a SIGKILL: the pid is in the name).
		auditDir = filepath.Join(g.dataDir, fmt.Sprintf(".bench-api-audit-%d", os.Getpid()))
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

	snap, err := benchSnapshot(ctx, e, o.tag, o.recipe, say)
	if err != nil {
		return err
	}

	auditNote := "audit log on (fsync per request, as in the daemon)"
	if o.noAudit {
		auditNote = "audit log off"
	}
	report := newBenchReport(ctx, e, "api", string(snap.VMM.Accel))
	report.Setup = fmt.Sprintf("snapshot `%s` (recipe %s, %d MiB, %d vCPU); pool %d; API on a Unix socket, %s",
		snap.Tag, snap.Image.Recipe, snap.MemoryMiB, snap.VCPUs, g.poolSize, auditNote)
	row := report.row
	pcts := func(xs []float64) (string, vals) {
		p50, p90, p99 := percentile(xs, 0.5), percentile(xs, 0.9), percentile(xs, 0.99)
		return fmt.Sprintf("%.2f / %.2f / %.2f ms", p50, p90, p99), vals{"p50_ms": p50, "p90_ms": p90, "p99_ms": p99}
	}
	argv := []string{"true"}
	var loadFailures int64

	// Overhead: one sandbox, the three paths interleaved call by call.
	if o.calls > 0 {
		waitPool(e, snap.ID, g.poolSize)
		sbs, err := e.Fork(ctx, o.tag, 1)
		if err != nil {
			return err
		}
		id := sbs[0].ID
		agent, err := e.Agent(id)
		if err != nil {
			return err
		}
		cl := client.New(sock)
		raw := unixHTTPClient(sock)
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
		say("overhead: %d sequential `exec true` per path, interleaved", o.calls)
		for i := 0; i < o.calls; i++ {
			// Rotate the order so no path always runs right after another.
			for k := range paths {
				p := &paths[(i+k)%len(paths)]
				c0 := ln.n.Load()
				start := time.Now()
				if err := p.call(); err != nil {
					return fmt.Errorf("exec via %s (call %d): %w", p.name, i+1, err)
				}
				p.ms = append(p.ms, float64(time.Since(start).Microseconds())/1000)
				p.conns += ln.n.Load() - c0
			}
		}
		if o.portCalls > 0 {
			if err := benchPortProxy(ctx, e, id, sock, o.portCalls, row); err != nil {
				return err
			}
		}
		e.Kill(ctx, []string{id})
		agentMs, ndjsonMs, jsonMs := paths[0].ms, paths[1].ms, paths[2].ms
		a50 := percentile(agentMs, 0.5)
		d1, d2 := percentile(ndjsonMs, 0.5)-a50, percentile(jsonMs, 0.5)-a50
		say("overhead: agent p50 %.2f ms, API NDJSON p50 %.2f ms (+%.2f), API JSON p50 %.2f ms (+%.2f)", a50, percentile(ndjsonMs, 0.5), d1, percentile(jsonMs, 0.5), d2)
		verdict := func(d float64) string {
			if d <= 5 {
				return "within the 5 ms target"
			}
			return "**over the 5 ms target**"
		}
		text, v := pcts(agentMs)
		row(fmt.Sprintf("`exec true` straight to the agent, %d sequential, p50 / p90 / p99", o.calls), text, v)
		text, v = pcts(ndjsonMs)
		row(fmt.Sprintf("`exec true` through the API, NDJSON stream (internal/client, the CLI), %d sequential, p50 / p90 / p99", o.calls), text, v)
		text, v = pcts(jsonMs)
		row(fmt.Sprintf("`exec true` through the API, buffered JSON (Accept: application/json), %d sequential, p50 / p90 / p99", o.calls), text, v)
		row("API overhead at p50, NDJSON / buffered JSON", fmt.Sprintf("%+.2f ms / %+.2f ms (%s / %s)", d1, d2, verdict(d1), verdict(d2)), vals{"ndjson_ms": d1, "json_ms": d2})
		row(fmt.Sprintf("new API connections over the %d calls, NDJSON / buffered JSON", o.calls), fmt.Sprintf("%d / %d", paths[1].conns, paths[2].conns),
			vals{"ndjson": float64(paths[1].conns), "json": float64(paths[2].conns)})
	}

	// Load: many API clients over a set of sandboxes.
	if o.clients > 0 {
		waitPool(e, snap.ID, g.poolSize)
		forkStart := time.Now()
		sbs, err := e.Fork(ctx, o.tag, o.sandboxes)
		if err != nil {
			return err
		}
		say("load: forked %d sandboxes in %s; %d clients for %s", len(sbs), time.Since(forkStart).Round(time.Millisecond), o.clients, o.duration)
		var ids []string
		for _, s := range sbs {
			ids = append(ids, s.ID)
		}
		var (
			lat            latencies
			requests, okN  atomic.Int64
			failures       atomic.Int64
			errMu          sync.Mutex
			firstErrs      []string
			peakGoroutines atomic.Int64
			perSandbox     = make([]atomic.Int64, len(ids))
		)
		fail := func(client, sb int, err error) {
			failures.Add(1)
			errMu.Lock()
			if len(firstErrs) < o.maxErrorsToShow {
				msg := fmt.Sprintf("client %d, sandbox %s: %v", client, ids[sb], err)
				firstErrs = append(firstErrs, msg)
				say("load: FAILED %s", msg)
			}
			errMu.Unlock()
		}
		shared := client.New(sock)
		execRoute := map[string]string{"route": "/v1/sandboxes/{id}/exec", "method": "POST", "code": "200"}
		srvSum0, srvN0 := histogram(m, "forkd_http_request_duration_seconds", execRoute)
		conns0 := ln.n.Load()
		issueUntil := time.Now().Add(o.duration)
		sampleDone := make(chan struct{})
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				if n := int64(runtime.NumGoroutine()); n > peakGoroutines.Load() {
					peakGoroutines.Store(n)
				}
				select {
				case <-sampleDone:
					return
				case <-t.C:
				}
			}
		}()
		progressDone := make(chan struct{})
		go func() {
			t := time.NewTicker(5 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					say("load: %d requests, %d failed so far", requests.Load(), failures.Load())
				}
			}
		}()
		start := time.Now()
		var wg sync.WaitGroup
		for c := 0; c < o.clients; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				cl := shared
				if !o.sharedClient {
					cl = client.New(sock)
				}
				sb := c % len(ids)
				for time.Now().Before(issueUntil) && ctx.Err() == nil {
					rctx, cancel := context.WithTimeout(ctx, o.requestTimeout)
					t := time.Now()
					ev, err := cl.Exec(rctx, ids[sb], apiv1.ExecRequest{Argv: argv}, nil, io.Discard, io.Discard)
					d := time.Since(t)
					cancel()
					requests.Add(1)
					perSandbox[sb].Add(1)
					if err == nil && ev.ExitCode != 0 {
						err = fmt.Errorf("exit code %d (%s)", ev.ExitCode, ev.Error)
					}
					if err != nil {
						if ctx.Err() != nil {
							return // interrupted: not the server's failure
						}
						fail(c, sb, err)
						continue
					}
					okN.Add(1)
					lat.add(d)
				}
			}(c)
		}
		wg.Wait()
		wall := time.Since(start)
		close(sampleDone)
		close(progressDone)
		if err := ctx.Err(); err != nil {
			return err
		}
		srvSum1, srvN1 := histogram(m, "forkd_http_request_duration_seconds", execRoute)
		conns := ln.n.Load() - conns0
		e.Kill(ctx, ids)
		ms := lat.ms
		n, nf := requests.Load(), failures.Load()
		minPer, maxPer := int64(-1), int64(0)
		for i := range perSandbox {
			v := perSandbox[i].Load()
			if minPer < 0 || v < minPer {
				minPer = v
			}
			if v > maxPer {
				maxPer = v
			}
		}
		say("load: %d requests in %s, %d failed; p50 %.1f ms p99 %.1f ms max %.1f ms; %.1f req/s",
			n, wall.Round(time.Millisecond), nf, percentile(ms, 0.5), percentile(ms, 0.99), maxOf(ms), float64(okN.Load())/wall.Seconds())
		clientsNote := "one API client each"
		if o.sharedClient {
			clientsNote = "one shared API client"
		}
		label := fmt.Sprintf("%d concurrent clients (%s), `exec true` over %d sandboxes for %s", o.clients, clientsNote, len(ids), o.duration)
		row(label+": requests / failed", fmt.Sprintf("%d / %d", n, nf), vals{"requests": float64(n), "failed": float64(nf)})
		text, v := pcts(ms)
		row(label+": latency p50 / p90 / p99", text, v)
		row(label+": latency mean / max", fmt.Sprintf("%.2f ms / %.2f ms", meanOf(ms), maxOf(ms)), vals{"mean_ms": meanOf(ms), "max_ms": maxOf(ms)})
		rps := float64(okN.Load()) / wall.Seconds()
		row(label+": throughput", fmt.Sprintf("%.1f req/s (%.1f s until the last answer)", rps, wall.Seconds()), vals{"req_per_s": rps, "wall_s": wall.Seconds()})
		row(label+": requests per sandbox, min / max", fmt.Sprintf("%d / %d", minPer, maxPer), vals{"min": float64(minPer), "max": float64(maxPer)})
		if srvN1 > srvN0 {
			handler := 1000 * (srvSum1 - srvSum0) / float64(srvN1-srvN0)
			row(label+": mean time in the API handler (whole handler: agent exec, stream teardown, audit append) / seen by the client",
				fmt.Sprintf("%.2f ms / %.2f ms", handler, meanOf(ms)), vals{"handler_ms": handler, "client_ms": meanOf(ms)})
		}
		row(label+": API connections accepted", fmt.Sprintf("%d", conns), vals{"connections": float64(conns)})
		row("peak goroutines in the bench process (clients + server + engine)", fmt.Sprintf("%d", peakGoroutines.Load()), vals{"goroutines": float64(peakGoroutines.Load())})
		report.Failures = firstErrs
		loadFailures = nf
	}
	if err := report.print(g.jsonOut); err != nil {
		return err
	}
	if loadFailures > 0 {
		return fmt.Errorf("bench api: %d load requests failed (see the report): %w", loadFailures, errdefs.ErrUnavailable)
	}
	return nil
}
