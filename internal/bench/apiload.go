package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
)

// load forks o.Sandboxes sandboxes and has o.Clients API clients loop
// `exec true` over them for o.Duration; it adds the load's rows and
// returns how many requests failed.
func (r *apiRun) load(ctx context.Context, o APIOptions) (int64, error) {
	e, say, argv := r.e, r.say, r.argv
	forkStart := time.Now()
	sbs, err := e.Fork(ctx, o.Tag, o.Sandboxes)
	if err != nil {
		return 0, err
	}
	say("load: forked %d sandboxes in %s; %d clients for %s", len(sbs), time.Since(forkStart).Round(time.Millisecond), o.Clients, o.Duration)
	ids := sandboxIDs(sbs)
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
		if len(firstErrs) < o.ShowErrors {
			msg := fmt.Sprintf("client %d, sandbox %s: %v", client, ids[sb], err)
			firstErrs = append(firstErrs, msg)
			say("load: FAILED %s", msg)
		}
		errMu.Unlock()
	}
	shared := client.New(r.sock)
	execRoute := map[string]string{"route": "/v1/sandboxes/{id}/exec", "method": "POST", "code": "200"}
	srvSum0, srvN0 := histogram(r.m, "forkd_http_request_duration_seconds", execRoute)
	conns0 := r.ln.n.Load()
	issueUntil := time.Now().Add(o.Duration)
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
	for c := 0; c < o.Clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := shared
			if !o.SharedClient {
				cl = client.New(r.sock)
			}
			sb := c % len(ids)
			for time.Now().Before(issueUntil) && ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
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
		return 0, err
	}
	srvSum1, srvN1 := histogram(r.m, "forkd_http_request_duration_seconds", execRoute)
	conns := r.ln.n.Load() - conns0
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
	if o.SharedClient {
		clientsNote = "one shared API client"
	}
	row := r.rep.row
	label := fmt.Sprintf("%d concurrent clients (%s), `exec true` over %d sandboxes for %s", o.Clients, clientsNote, len(ids), o.Duration)
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
	r.rep.Failures = firstErrs
	return nf, nil
}
