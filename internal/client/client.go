// Package client is the Go client of forkd's HTTP API. The CLI uses it, so
// the CLI takes the same code path as the SDKs: every command is an API call.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Client talks to one daemon.
type Client struct {
	socket string // where the daemon is, for messages
	base   string // URL prefix
	token  string
	local  bool // on the daemon's Unix socket
	http   *http.Client
}

// New returns a client for the daemon listening on a Unix socket.
func New(socketPath string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConnsPerHost: 64,
	}
	return &Client{socket: socketPath, base: "http://forkd", local: true, http: &http.Client{Transport: tr}}
}

// WithToken makes c present token on every request. On the local socket
// the request then acts as the token's tenant, under its role and quotas,
// instead of as the socket's admin. It returns c.
func (c *Client) WithToken(token string) *Client {
	c.token = token
	return c
}

// Remote configures a client for a daemon listening on TCP.
type Remote struct {
	// Host is the daemon's URL: https://host:port (or http://127.0.0.1:port
	// for a loopback listener without TLS).
	Host string
	// Token is a bearer token created by the daemon (`forkd token create`).
	Token string
	// CACert is a PEM file that signs the daemon's certificate; empty uses
	// the system roots.
	CACert string
}

// NewRemote returns a client for a daemon listening on TCP.
func NewRemote(r Remote) (*Client, error) {
	u, err := url.Parse(r.Host)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("host %q: want https://HOST:PORT: %w", r.Host, errdefs.ErrInvalidArgument)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	if r.CACert != "" {
		pem, err := os.ReadFile(r.CACert)
		if err != nil {
			return nil, fmt.Errorf("CA certificate: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA certificate %s has no PEM certificate: %w", r.CACert, errdefs.ErrInvalidArgument)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Client{socket: r.Host, base: strings.TrimSuffix(r.Host, "/"), token: r.Token, http: &http.Client{Transport: tr}}, nil
}

// Error is a problem returned by the daemon. It unwraps to the errdefs class
// named by its code, so errors.Is(err, errdefs.ErrNotFound) works here too.
type Error struct {
	apiv1.Problem
}

func (e *Error) Error() string { return e.Detail }
func (e *Error) Unwrap() error { return errdefs.FromCode(e.Code) }

// ErrDaemonNotRunning is returned when nothing listens on the socket.
var ErrDaemonNotRunning = errors.New("forkd daemon is not running")

func (c *Client) url(path string, q url.Values) string {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

func (c *Client) send(ctx context.Context, method, path string, q url.Values, body io.Reader, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.connectError(err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeProblem(resp)
	}
	return resp, nil
}

// connectError explains a request that reached no daemon.
func (c *Client) connectError(err error) error {
	if c.local && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)) {
		return fmt.Errorf("%w at %s: start it with `forkd daemon start` (or `forkd serve`): %w", ErrDaemonNotRunning, c.socket, errdefs.ErrUnavailable)
	}
	if c.local && errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("forkd daemon at %s: permission denied: use sudo, or join the socket's group (sudo usermod -aG forkd $USER, then log in again; membership is root-equivalent on this host): %w",
			c.socket, errdefs.ErrPermissionDenied)
	}
	return fmt.Errorf("forkd daemon at %s: %w", c.socket, err)
}

func decodeProblem(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var p apiv1.Problem
	if err := json.Unmarshal(data, &p); err != nil || p.Detail == "" {
		return &Error{apiv1.Problem{Status: resp.StatusCode, Code: "internal", Detail: fmt.Sprintf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(data))}}
	}
	return &Error{p}
}

// call sends a JSON request (nil for none) and decodes a JSON response
// into out (nil to discard).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	return c.callHeader(ctx, method, path, q, http.Header{}, in, out)
}

// callHeader is call with extra request headers.
func (c *Client) callHeader(ctx context.Context, method, path string, q url.Values, hdr http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
		hdr.Set("Content-Type", "application/json")
	}
	resp, err := c.send(ctx, method, path, q, body, hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

// Ping checks that the daemon answers.
func (c *Client) Ping(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, "/v1/healthz", nil, nil, nil)
}

// Version of the daemon.
func (c *Client) Version(ctx context.Context) (apiv1.Version, error) {
	var v apiv1.Version
	return v, c.call(ctx, http.MethodGet, "/v1/version", nil, nil, &v)
}

// Doctor runs the daemon host's checks.
func (c *Client) Doctor(ctx context.Context) ([]apiv1.Check, error) {
	var out []apiv1.Check
	return out, c.call(ctx, http.MethodGet, "/v1/doctor", nil, nil, &out)
}

// Images lists built images, every page, newest first.
func (c *Client) Images(ctx context.Context) ([]apiv1.Image, error) {
	return listAll[apiv1.Image](ctx, c, "/v1/images", nil)
}

// progress reads an NDJSON progress stream until its final line.
func (c *Client) progress(ctx context.Context, path string, in any, onMsg func(string)) (apiv1.Progress, error) {
	data, _ := json.Marshal(in)
	resp, err := c.send(ctx, http.MethodPost, path, nil, bytes.NewReader(data), http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		return apiv1.Progress{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var p apiv1.Progress
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return p, fmt.Errorf("decode progress: %w", err)
		}
		switch {
		case p.Error != nil:
			return p, &Error{*p.Error}
		case p.Image != nil || p.Snapshot != nil:
			return p, nil
		case onMsg != nil:
			onMsg(p.Message)
		}
	}
	if err := sc.Err(); err != nil {
		return apiv1.Progress{}, fmt.Errorf("progress stream cut: %w", err)
	}
	return apiv1.Progress{}, fmt.Errorf("progress stream ended without a result (daemon died?): %w", errdefs.ErrUnavailable)
}

// BuildImage builds a recipe's image: it starts the build operation and
// follows its events, reporting progress lines, until it ends.
func (c *Client) BuildImage(ctx context.Context, req apiv1.BuildImageRequest, onMsg func(string)) (apiv1.Image, error) {
	op, err := c.StartBuildImage(ctx, req, "")
	if err != nil {
		return apiv1.Image{}, err
	}
	var img apiv1.Image
	return img, c.awaitOperation(ctx, op.ID, onMsg, &img)
}

// CreateSnapshot makes a warmed template snapshot: it starts the create
// operation and follows it until it ends. If ctx ends first the snapshot
// is still created (the daemon owns the work); cancel it with
// CancelOperation.
func (c *Client) CreateSnapshot(ctx context.Context, req apiv1.CreateSnapshotRequest, onMsg func(string)) (apiv1.Snapshot, error) {
	op, err := c.StartCreateSnapshot(ctx, req, "")
	if errors.Is(err, errLegacyStream) {
		return c.createSnapshotStream(ctx, req, onMsg)
	}
	if err != nil {
		return apiv1.Snapshot{}, err
	}
	var snap apiv1.Snapshot
	return snap, c.awaitOperation(ctx, op.ID, onMsg, &snap)
}

// createSnapshotStream is CreateSnapshot with a daemon from before
// operations, which answers a progress stream.
func (c *Client) createSnapshotStream(ctx context.Context, req apiv1.CreateSnapshotRequest, onMsg func(string)) (apiv1.Snapshot, error) {
	p, err := c.progress(ctx, "/v1/snapshots", req, onMsg)
	if err != nil {
		return apiv1.Snapshot{}, err
	}
	if p.Snapshot == nil {
		return apiv1.Snapshot{}, fmt.Errorf("daemon sent no snapshot: %w", errdefs.ErrInternal)
	}
	return *p.Snapshot, nil
}

// Snapshots lists snapshot tags, every page.
func (c *Client) Snapshots(ctx context.Context) ([]apiv1.Snapshot, error) {
	return listAll[apiv1.Snapshot](ctx, c, "/v1/snapshots", nil)
}

// Snapshot describes one tag.
func (c *Client) Snapshot(ctx context.Context, tag string) (apiv1.Snapshot, error) {
	var out apiv1.Snapshot
	return out, c.call(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(tag), nil, nil, &out)
}

// RemoveSnapshot deletes a tag.
func (c *Client) RemoveSnapshot(ctx context.Context, tag string) error {
	_, err := c.RemoveSnapshotWith(ctx, tag, false, false)
	return err
}

// RemoveSnapshotWith deletes a tag that layers may depend on: cascade
// removes them too, force removes the tag alone. It returns the tags
// removed (a daemon that answers 204, from before the list, removed tag
// and, with cascade, layers it did not name).
func (c *Client) RemoveSnapshotWith(ctx context.Context, tag string, cascade, force bool) ([]string, error) {
	q := url.Values{}
	if cascade {
		q.Set("cascade", "true")
	}
	if force {
		q.Set("force", "true")
	}
	var out apiv1.RemovedSnapshots
	if err := c.call(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(tag), q, nil, &out); err != nil {
		return nil, err
	}
	if len(out.Removed) == 0 {
		out.Removed = []string{tag}
	}
	return out.Removed, nil
}

// Compact writes a flat copy of the snapshot from under the tag to (the
// daemon answers once written; the copy goes on if ctx ends first).
func (c *Client) Compact(ctx context.Context, from, to string) (apiv1.Snapshot, error) {
	var out apiv1.Snapshot
	return out, c.call(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(from)+"/compact", nil, apiv1.CompactRequest{To: to}, &out)
}

// Fork creates req.Count sandboxes from req.Tag; it returns when all
// answer.
func (c *Client) Fork(ctx context.Context, req apiv1.ForkRequest) (apiv1.ForkResponse, error) {
	return c.ForkIdempotent(ctx, req, "")
}

// ForkIdempotent is Fork with an Idempotency-Key (none if key is empty):
// a retry with the same key and request gets the first fork's sandboxes,
// not new ones.
func (c *Client) ForkIdempotent(ctx context.Context, req apiv1.ForkRequest, key string) (apiv1.ForkResponse, error) {
	var out apiv1.ForkResponse
	return out, c.callHeader(ctx, http.MethodPost, "/v1/sandboxes", nil, idempotencyHeader(key), req, &out)
}

// Sandboxes lists sandboxes, optionally filtered by tag, state and labels
// ("key=value", all must match).
func (c *Client) Sandboxes(ctx context.Context, tag, state string, labels ...string) ([]apiv1.Sandbox, error) {
	q := url.Values{}
	if tag != "" {
		q.Set("tag", tag)
	}
	if state != "" {
		q.Set("state", state)
	}
	for _, l := range labels {
		q.Add("label", l)
	}
	return listAll[apiv1.Sandbox](ctx, c, "/v1/sandboxes", q)
}

// Sandbox describes one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (apiv1.Sandbox, error) {
	var out apiv1.Sandbox
	return out, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &out)
}

// Kill stops sandboxes (all of them with all=true).
func (c *Client) Kill(ctx context.Context, ids []string, all bool) ([]string, error) {
	var out apiv1.KillResponse
	return out.Killed, c.call(ctx, http.MethodPost, "/v1/sandboxes/kill", nil, apiv1.KillRequest{IDs: ids, All: all}, &out)
}

// RunCode runs Python in the sandbox's persistent session.
func (c *Client) RunCode(ctx context.Context, id string, req apiv1.RunCodeRequest) (apiv1.RunCodeResult, error) {
	var out apiv1.RunCodeResult
	return out, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/run_code", nil, req, &out)
}

// Exec runs a process, streaming stdin (when req.Stdin) and its output, and
// returns the exit event. A stream cut before the exit event is an error.
func (c *Client) Exec(ctx context.Context, id string, req apiv1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExecEvent, error) {
	return c.ExecEvents(ctx, id, req, stdin, func(ev apiv1.ExecEvent) error {
		var err error
		switch ev.Type {
		case agentapi.EventStdout:
			_, err = stdout.Write(ev.Data)
		case agentapi.EventStderr:
			_, err = stderr.Write(ev.Data)
		}
		return err
	})
}

// ExecEvents runs a process as Exec does and hands every event of its
// stream to onEvent as it arrives: stdout and stderr chunks, then the exit
// event, which is also returned. An error from onEvent ends the call (and
// with it the request, so the daemon stops the process's output).
func (c *Client) ExecEvents(ctx context.Context, id string, req apiv1.ExecRequest, stdin io.Reader, onEvent func(apiv1.ExecEvent) error) (apiv1.ExecEvent, error) {
	hdr, err := json.Marshal(req)
	if err != nil {
		return apiv1.ExecEvent{}, err
	}
	var body io.Reader = http.NoBody
	if req.Stdin && stdin != nil {
		body = stdin
	}
	resp, err := c.send(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, body, http.Header{apiv1.ExecHeader: {string(hdr)}})
	if err != nil {
		return apiv1.ExecEvent{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev apiv1.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			return apiv1.ExecEvent{}, fmt.Errorf("exec stream cut before the process exited: %w", err)
		}
		if err := onEvent(ev); err != nil {
			return apiv1.ExecEvent{}, err
		}
		if ev.Type != agentapi.EventExit {
			continue
		}
		// Read to the end so the connection is reused: closing a body
		// early makes the transport drop it (a new TCP+TLS handshake per
		// exec with --host).
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if ev.Error != "" && ev.ExitCode == -1 {
			if ev.Code != "" { // the error as the daemon classed it
				return ev, &Error{apiv1.Problem{Detail: ev.Error, Code: ev.Code}}
			}
			return ev, fmt.Errorf("exec: %s: %w", ev.Error, errdefs.ErrFailedPrecondition)
		}
		return ev, nil
	}
}

func fileQuery(path string) url.Values { return url.Values{"path": {path}} }

// ReadFile streams a sandbox file into w.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/files", fileQuery(path), nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("read %s: stream cut after %d bytes: %w", path, n, err)
	}
	return n, nil
}

// WriteFile streams r into a sandbox file (created or replaced atomically).
func (c *Client) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (apiv1.FileInfo, error) {
	q := fileQuery(path)
	q.Set("mode", "0"+strconv.FormatUint(uint64(mode), 8))
	resp, err := c.send(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/files", q, r, http.Header{"Content-Type": {"application/octet-stream"}})
	if err != nil {
		return apiv1.FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi apiv1.FileInfo
	return fi, json.NewDecoder(resp.Body).Decode(&fi)
}

// ListFiles lists a sandbox directory.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]apiv1.FileInfo, error) {
	var out []apiv1.FileInfo
	return out, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/files/list", fileQuery(path), nil, &out)
}

// Stat describes a sandbox file.
func (c *Client) Stat(ctx context.Context, id, path string) (apiv1.FileInfo, error) {
	var out apiv1.FileInfo
	return out, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/files/stat", fileQuery(path), nil, &out)
}

// Mkdir creates a sandbox directory.
func (c *Client) Mkdir(ctx context.Context, id string, req apiv1.MkdirRequest) (apiv1.FileInfo, error) {
	var out apiv1.FileInfo
	return out, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/files/mkdir", nil, req, &out)
}

// Remove deletes a sandbox file or directory.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := fileQuery(path)
	if recursive {
		q.Set("recursive", "1")
	}
	return c.call(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id)+"/files", q, nil, nil)
}

// Branch snapshots a running sandbox into a new tag.
func (c *Client) Branch(ctx context.Context, id string, req apiv1.BranchRequest) (apiv1.BranchResponse, error) {
	var out apiv1.BranchResponse
	return out, c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/branch", nil, req, &out)
}

// Network returns a sandbox's egress policy and traffic counters.
func (c *Client) Network(ctx context.Context, id string) (apiv1.SandboxNetwork, error) {
	var out apiv1.SandboxNetwork
	return out, c.call(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, nil, &out)
}

// SetNetwork changes a running sandbox's egress policy.
func (c *Client) SetNetwork(ctx context.Context, id string, p apiv1.NetworkPolicy) (apiv1.SandboxNetwork, error) {
	var out apiv1.SandboxNetwork
	return out, c.call(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, p, &out)
}

// SetLifetime changes a running sandbox's timeout (from now) or idle
// timeout (PATCH /v1/sandboxes/{id}).
func (c *Client) SetLifetime(ctx context.Context, id string, p apiv1.SandboxPatch) (apiv1.Sandbox, error) {
	var out apiv1.Sandbox
	return out, c.call(ctx, http.MethodPatch, "/v1/sandboxes/"+url.PathEscape(id), nil, p, &out)
}

// Port says where a sandbox's TCP port is served (the proxy path, and the
// host when the daemon routes PORT-ID.DOMAIN).
func (c *Client) Port(ctx context.Context, id string, port int) (apiv1.Port, error) {
	var out apiv1.Port
	return out, c.call(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/ports/%d", url.PathEscape(id), port), nil, nil, &out)
}

// URL is the absolute URL of path on the daemon (for a Unix socket, an
// http://forkd URL only this client can reach).
func (c *Client) URL(path string) string { return c.url(path, nil) }

// Tunnel opens a raw TCP connection to a port inside a sandbox, through
// the API (an HTTP upgrade): what is written reaches the port, what it
// sends is read. ctx bounds the opening only.
func (c *Client) Tunnel(ctx context.Context, id string, port int) (io.ReadWriteCloser, error) {
	hdr := http.Header{}
	hdr.Set("Connection", "Upgrade")
	hdr.Set("Upgrade", "tcp")
	resp, err := c.send(context.WithoutCancel(ctx), http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/ports/%d", url.PathEscape(id), port), nil, nil, hdr)
	if err != nil {
		return nil, err
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("sandbox %s port %d: the daemon answered %s, not a tunnel (an older daemon?): %w", id, port, resp.Status, errdefs.ErrUnavailable)
	}
	return rwc, nil
}
