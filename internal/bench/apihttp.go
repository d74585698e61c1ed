package bench

// HTTP helpers of bench api: the API's exec with its buffered answer, a
// client on the API's Unix socket, a listener counting connections, and
// the server's request histogram.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/metrics"
)

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

// unixHTTPClient is an HTTP client of the API on socket sock.
func unixHTTPClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 64,
	}}
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
