package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// This file is the controller's client of one node's forkd REST API
// (internal/api/openapi.yaml in the root module). The k8s module must not
// import the root module, so the few JSON shapes it needs are its own,
// named after the schemas they follow; fields it does not use are left out
// (the daemon's responses may carry more).

// apiHealth is the Health schema (GET /v1/healthz).
type apiHealth struct {
	Status string `json:"status"`
}

// apiInfo is the part of the Info schema (GET /v1/info) the controller
// reads.
type apiInfo struct {
	Version    string   `json:"version"`
	APIVersion string   `json:"api_version"`
	Features   []string `json:"features"`
	Limits     struct {
		MaxSandboxes int `json:"max_sandboxes"`
	} `json:"limits"`
	// Capacity is reported to admin tokens only (the controller's).
	Capacity *apiCapacity `json:"capacity,omitempty"`
}

// apiCapacity is the part of Info's capacity the controller reads.
type apiCapacity struct {
	GuestMemoryCommittedBytes int64 `json:"guest_memory_committed_bytes"`
	GuestMemoryLimitBytes     int64 `json:"guest_memory_limit_bytes"`
	HostMemoryTotalBytes      int64 `json:"host_memory_total_bytes"`
	DiskFreeBytes             int64 `json:"disk_free_bytes"`
}

// apiSnapshot is the part of the Snapshot schema the controller reads.
type apiSnapshot struct {
	Tag       string `json:"tag"`
	MemoryMiB int    `json:"memory_mib"`
	DiskBytes int64  `json:"disk_bytes"`
	State     string `json:"state"`
	// Owner and SharedWith, shown to admins in full: who may fork it.
	Owner      string   `json:"owner,omitempty"`
	SharedWith []string `json:"shared_with,omitempty"`
	// Pooled is how many VMMs the node's pool holds ready for it.
	Pooled int `json:"pooled_vmms"`
}

// apiSnapshotList is the SnapshotList schema (GET /v1/snapshots).
type apiSnapshotList struct {
	Items      []apiSnapshot `json:"items"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// apiNetworkPolicy is the NetworkPolicy schema.
type apiNetworkPolicy struct {
	Mode           string   `json:"mode"`
	Allow          []string `json:"allow,omitempty"`
	MaxConnections int      `json:"max_connections,omitempty"`
	RateMbit       int      `json:"rate_mbit,omitempty"`
}

// apiForkRequest is the ForkRequest schema (POST /v1/sandboxes).
type apiForkRequest struct {
	Tag                string            `json:"tag"`
	Count              int               `json:"count"`
	TimeoutSeconds     *int64            `json:"timeout_s,omitempty"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_s,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	Network            *apiNetworkPolicy `json:"network,omitempty"`
	CPUs               float64           `json:"cpus,omitempty"`
}

// apiSandbox is the part of the Sandbox schema the controller reads.
type apiSandbox struct {
	ID         string            `json:"id"`
	Tag        string            `json:"tag"`
	State      string            `json:"state"`
	DeadReason string            `json:"dead_reason,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

// apiForkResponse is the ForkResponse schema.
type apiForkResponse struct {
	Sandboxes []apiSandbox `json:"sandboxes"`
	TotalMs   float64      `json:"total_ms"`
}

// Problem is the RFC 9457 problem document every forkd error is.
type Problem struct {
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	RequestID string `json:"request_id,omitempty"`
}

// APIError is a forkd API answer that was not a success.
type APIError struct {
	Method, URL string
	Status      int
	Problem     Problem
}

func (e *APIError) Error() string {
	msg := e.Problem.Detail
	if msg == "" {
		msg = e.Problem.Title
	}
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.URL, e.Status, e.Problem.Code, msg)
}

// statusOf returns the HTTP status of a forkd API error, 0 for another
// error (the node did not answer).
func statusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// NodeClient talks to one node's forkd daemon.
type NodeClient struct {
	// Base is the daemon's API root, https://10.0.0.5:7070.
	Base string
	// Token is the bearer token (the daemon requires one on TCP).
	Token string
	HTTP  *http.Client
}

// do sends one request and decodes a JSON answer into out (nil: discard).
func (c *NodeClient) do(ctx context.Context, method, path string, hdr http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := strings.TrimSuffix(c.Base, "/") + path
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, u, err)
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{Method: method, URL: u, Status: resp.StatusCode}
		if json.Unmarshal(data, &ae.Problem) != nil || ae.Problem.Code == "" {
			ae.Problem.Detail = strings.TrimSpace(string(data))
		}
		return ae
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, u, err)
	}
	return nil
}

// Healthz is GET /v1/healthz.
func (c *NodeClient) Healthz(ctx context.Context) error {
	var h apiHealth
	if err := c.do(ctx, http.MethodGet, "/v1/healthz", nil, nil, &h); err != nil {
		return err
	}
	if h.Status != "ok" {
		return fmt.Errorf("GET %s/v1/healthz: status %q, want ok", c.Base, h.Status)
	}
	return nil
}

// Info is GET /v1/info.
func (c *NodeClient) Info(ctx context.Context) (apiInfo, error) {
	var i apiInfo
	err := c.do(ctx, http.MethodGet, "/v1/info", nil, nil, &i)
	return i, err
}

// Snapshots lists every snapshot (GET /v1/snapshots, all pages).
func (c *NodeClient) Snapshots(ctx context.Context) ([]apiSnapshot, error) {
	var all []apiSnapshot
	cursor := ""
	for page := 0; ; page++ {
		if page > 10000 {
			return nil, fmt.Errorf("GET %s/v1/snapshots: more than 10000 pages", c.Base)
		}
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var l apiSnapshotList
		if err := c.do(ctx, http.MethodGet, "/v1/snapshots?"+q.Encode(), nil, nil, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Items...)
		if l.NextCursor == "" {
			return all, nil
		}
		cursor = l.NextCursor
	}
}

// ActForHeader makes a request to a daemon act for a tenant: the
// controller's admin token acting as a user of that tenant (forkd's
// docs/SECURITY.md). The controller and the gateway act so for a
// Sandbox's namespace, so what it creates on a node (the sandbox, the
// snapshots it branches) is the namespace's, visible to no other.
const ActForHeader = "Forkd-Tenant"

// actingFor is the headers of a request acting for tenant (none for "":
// as the admin itself).
func actingFor(tenant string) http.Header {
	hdr := http.Header{}
	if tenant != "" {
		hdr.Set(ActForHeader, tenant)
	}
	return hdr
}

// Fork is POST /v1/sandboxes with an Idempotency-Key, so a retry after a
// lost answer (or a controller restart) gets the first fork's sandbox
// instead of a second one. It acts for tenant (the Sandbox's namespace):
// the sandbox is the tenant's, its snapshot must be one the tenant sees
// (its own, shared with it, or the node's operator's), and the tenant's
// quota on the node holds.
func (c *NodeClient) Fork(ctx context.Context, key, tenant string, req apiForkRequest) (apiForkResponse, error) {
	hdr := actingFor(tenant)
	hdr.Set("Idempotency-Key", key)
	hdr.Set("X-Request-Id", requestID(key))
	var out apiForkResponse
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes", hdr, req, &out)
	return out, err
}

// apiPullRequest is the PullSnapshotRequest schema (POST
// /v1/snapshots/pull).
type apiPullRequest struct {
	Ref string `json:"ref"`
	Tag string `json:"tag,omitempty"`
}

// errTagTaken is PullSnapshot's answer when the tag is held on the node
// by a tenant that does not share it with this one.
var errTagTaken = errors.New("the tag is another tenant's on this node")

// PullSnapshot is POST /v1/snapshots/pull acting for tenant: the node
// fetches ref and keeps it under tag as the tenant's, answering once it
// is pulled (201). A 409 means the tag is held already (a pull for
// another sandbox of the tenant won, or another tenant's) or this key's
// pull is still running: the tag being ready to the tenant tells them
// apart, and only the first is no error; one the tenant cannot see at
// all is errTagTaken.
func (c *NodeClient) PullSnapshot(ctx context.Context, key, tenant, ref, tag string) error {
	hdr := actingFor(tenant)
	if key != "" {
		hdr.Set("Idempotency-Key", key)
		hdr.Set("X-Request-Id", requestID(key))
	}
	err := c.do(ctx, http.MethodPost, "/v1/snapshots/pull", hdr, apiPullRequest{Ref: ref, Tag: tag}, nil)
	if statusOf(err) != http.StatusConflict {
		return err
	}
	snap, gerr := c.snapshot(ctx, tag, tenant)
	switch {
	case gerr == nil && snap.ready():
		return nil
	case statusOf(gerr) == http.StatusNotFound:
		return fmt.Errorf("pull %s as %s on %s: %w (%v)", tag, tenant, c.Base, errTagTaken, err)
	}
	return err
}

// Snapshot is GET /v1/snapshots/{tag} (as the admin: with its owner and
// shares).
func (c *NodeClient) Snapshot(ctx context.Context, tag string) (apiSnapshot, error) {
	return c.snapshot(ctx, tag, "")
}

// snapshot is GET /v1/snapshots/{tag} acting for tenant.
func (c *NodeClient) snapshot(ctx context.Context, tag, tenant string) (apiSnapshot, error) {
	var snap apiSnapshot
	err := c.do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(tag), actingFor(tenant), nil, &snap)
	return snap, err
}

// ready says the snapshot can be forked (a daemon that reports no state
// has only ready ones).
func (s apiSnapshot) ready() bool { return s.State == "" || s.State == "ready" }

// Sandbox is GET /v1/sandboxes/{id}.
func (c *NodeClient) Sandbox(ctx context.Context, id string) (apiSandbox, error) {
	var s apiSandbox
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &s)
	return s, err
}

// DeleteSandbox is DELETE /v1/sandboxes/{id}; a sandbox already gone (404)
// is not an error.
func (c *NodeClient) DeleteSandbox(ctx context.Context, id string) error {
	err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, nil)
	if statusOf(err) == http.StatusNotFound {
		return nil
	}
	return err
}

// requestID makes an X-Request-Id from an idempotency key: 1-128 of
// A-Z a-z 0-9 . _ : - (other characters become -).
func requestID(key string) string {
	b := []byte(key)
	if len(b) > 128 {
		b = b[:128]
	}
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			b[i] = '-'
		}
	}
	return string(b)
}

// defaultHTTPClient is used when none is given. It has no overall
// timeout: each call's context bounds it (a fork that pulls its snapshot
// takes minutes, a health check seconds).
func defaultHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = 0
	t.TLSHandshakeTimeout = 10 * time.Second
	t.MaxIdleConnsPerHost = 8
	return &http.Client{Transport: t}
}

// apiSandboxList is the SandboxList schema (GET /v1/sandboxes).
type apiSandboxList struct {
	Items      []apiSandbox `json:"items"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// SandboxesLabelled lists the sandboxes whose metadata has key=value
// (GET /v1/sandboxes?label=key=value, all pages).
func (c *NodeClient) SandboxesLabelled(ctx context.Context, key, value string) ([]apiSandbox, error) {
	var all []apiSandbox
	cursor := ""
	for page := 0; page < 10000; page++ {
		q := url.Values{"label": {key + "=" + value}, "limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var l apiSandboxList
		if err := c.do(ctx, http.MethodGet, "/v1/sandboxes?"+q.Encode(), nil, nil, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Items...)
		if l.NextCursor == "" {
			return all, nil
		}
		cursor = l.NextCursor
	}
	return nil, fmt.Errorf("GET %s/v1/sandboxes: more than 10000 pages", c.Base)
}
