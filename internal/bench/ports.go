package bench

// bench api's port-proxy measure.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// portProxy measures the port proxy's overhead (bench api): a
// busybox httpd in sandbox id serves a small file on port 8080, fetched
// calls times over a kept-alive connection straight from the sandbox's
// namespace (Engine.DialPort, what the proxy itself dials) and through the
// API's proxy on the Unix socket, interleaved request by request.
func portProxy(ctx context.Context, e *sandbox.Engine, id, sock string, calls int, row func(string, string, vals), say sayFunc) error {
	agent, err := e.Agent(id)
	if err != nil {
		return err
	}
	const port = 8080
	ev, err := agent.Exec(ctx, agentapi.ExecRequest{Shell: fmt.Sprintf(
		"mkdir -p /tmp/www && echo hello > /tmp/www/f && httpd -p %d -h /tmp/www", port)}, nil, io.Discard, io.Discard)
	if err != nil || ev.ExitCode != 0 {
		return fmt.Errorf("start httpd in the sandbox: exit %d, %v", ev.ExitCode, err)
	}
	direct := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return e.DialPort(ctx, id, port) },
	}}
	proxied := unixHTTPClient(sock)
	get := func(c *http.Client, url string) error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && (resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "hello") {
			err = fmt.Errorf("status %d, %q", resp.StatusCode, b)
		}
		return err
	}
	paths := []struct {
		name string
		call func() error
		ms   []float64
	}{
		{name: "direct", call: func() error { return get(direct, fmt.Sprintf("http://sandbox:%d/f", port)) }},
		{name: "proxy", call: func() error { return get(proxied, fmt.Sprintf("http://forkd/v1/sandboxes/%s/ports/%d/f", id, port)) }},
	}
	// httpd may take a moment to listen; then warm both paths.
	deadline := time.Now().Add(time.Minute)
	for paths[0].call() != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("httpd in the sandbox did not answer within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 5 {
		for _, p := range paths {
			if err := p.call(); err != nil {
				return fmt.Errorf("warm-up GET %s: %w", p.name, err)
			}
		}
	}
	say("port proxy: %d sequential GETs per path, interleaved", calls)
	for i := range calls {
		for k := range paths {
			p := &paths[(i+k)%len(paths)]
			start := time.Now()
			if err := p.call(); err != nil {
				return fmt.Errorf("GET via %s (call %d): %w", p.name, i+1, err)
			}
			p.ms = append(p.ms, millis(time.Since(start)))
		}
	}
	d50, p50 := percentile(paths[0].ms, 0.5), percentile(paths[1].ms, 0.5)
	verdict := "within the 1 ms target"
	if p50-d50 > 1 {
		verdict = "**over the 1 ms target**"
	}
	row(fmt.Sprintf("HTTP GET of a 6-byte file from httpd in the sandbox, kept-alive, %d sequential: from its namespace / through the API's port proxy, p50", calls),
		fmt.Sprintf("%.2f ms / %.2f ms", d50, p50), vals{"direct_p50_ms": d50, "proxy_p50_ms": p50})
	row("port proxy overhead at p50", fmt.Sprintf("%+.2f ms (%s)", p50-d50, verdict), vals{"overhead_ms": p50 - d50})
	return nil
}
