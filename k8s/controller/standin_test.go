package controller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// standIn is a contract stand-in for one node's forkd daemon: an
// httptest server answering only the routes the controller calls, as
// internal/api/openapi.yaml (in the root module) describes them, and
// checking every request against that contract: the bearer token, the
// Content-Type, the X-Request-Id and Idempotency-Key patterns, and the
// ForkRequest body (no unknown field, since the schema has
// additionalProperties: false; required fields; enums and ranges). A
// request that breaks the contract is answered 400 and fails the test.
//
// It is not forkd: it forks nothing, and it answers as the contract says
// the daemon does, not as the daemon does. Tests against real daemons in a
// real cluster are still to come (docs/KUBERNETES.md).
type standIn struct {
	t     *testing.T
	srv   *httptest.Server
	token string

	mu        sync.Mutex
	down      bool
	snapshots map[string]int // tag -> memory_mib
	sandboxes map[string]*standInSandbox
	forks     []forkCall // every POST /v1/sandboxes, replays included
	created   int        // sandboxes actually created
	deletes   []string   // ids of DELETE /v1/sandboxes/{id}
	idem      map[string]idemEntry
	next      int
	// capacity, when set, is GET /v1/info's capacity (the daemon's room).
	capacity map[string]any
	// pulls are the POST /v1/snapshots/pull calls (REF as TAG); with
	// pullFails every pull is a 404 from the registry.
	pulls     []string
	pullFails bool
	// snapshotGets are the tags of GET /v1/snapshots/{tag}.
	snapshotGets []string
	// owners are the tenants owning tags (none: the operator's); a fork
	// acting for another tenant is a 404, as forkd answers it.
	owners map[string]string
	// pooled are the VMMs its pool holds ready, by tag (pooled_vmms).
	pooled map[string]int
	// stall, when set, holds GET /v1/snapshots/{stallTag} until closed.
	stall    chan struct{}
	stallTag string
}

type standInSandbox struct {
	ID, Tag, State string
	Metadata       map[string]string
}

type forkCall struct {
	Key string
	// Tenant is the Forkd-Tenant the controller acted for.
	Tenant string
	Body   standInForkRequest
}

type idemEntry struct {
	body []byte
	resp []byte
}

// standInForkRequest mirrors the ForkRequest schema, every property, so
// that decoding with DisallowUnknownFields is the schema's
// additionalProperties: false.
type standInForkRequest struct {
	Tag              string            `json:"tag"`
	Count            *int              `json:"count"`
	PullPolicy       string            `json:"pull_policy,omitempty"`
	RegistryUsername string            `json:"registry_username,omitempty"`
	RegistryPassword string            `json:"registry_password,omitempty"`
	TimeoutS         *int64            `json:"timeout_s,omitempty"`
	IdleTimeoutS     *int64            `json:"idle_timeout_s,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Network          *struct {
		Mode           string   `json:"mode"`
		Allow          []string `json:"allow,omitempty"`
		MaxConnections *int     `json:"max_connections,omitempty"`
		RateMbit       *int     `json:"rate_mbit,omitempty"`
	} `json:"network,omitempty"`
	CPUs *float64 `json:"cpus,omitempty"`
}

var (
	requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	tagPattern       = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	tenantPattern    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	refPattern       = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?/.+(:[^/]+|@sha256:[0-9a-f]{64})$`)
)

func newStandIn(t *testing.T, snapshots map[string]int) *standIn {
	s := &standIn{
		t: t, token: "forkd_standin-token", snapshots: map[string]int{},
		sandboxes: map[string]*standInSandbox{}, idem: map[string]idemEntry{},
	}
	for tag, mib := range snapshots {
		s.snapshots[tag] = mib
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// ownerOf is the tenant owning tag ("default": the operator).
func (s *standIn) ownerOf(tag string) string {
	if o := s.owners[tag]; o != "" {
		return o
	}
	return "default"
}

func (s *standIn) setDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// problem answers an RFC 9457 problem, as every forkd error is.
func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"title": http.StatusText(status), "status": status, "detail": detail, "code": code,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// violation records a breach of the contract and answers 400.
func (s *standIn) violation(w http.ResponseWriter, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.t.Errorf("contract stand-in: %s", msg)
	problem(w, http.StatusBadRequest, "invalid_argument", msg)
}

func (s *standIn) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	stall, stallTag := s.stall, s.stallTag
	s.mu.Unlock()
	if stall != nil && r.Method == http.MethodGet && r.URL.Path == "/v1/snapshots/"+stallTag {
		select { // a node slow to answer for this tag
		case <-stall:
		case <-r.Context().Done():
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		problem(w, http.StatusServiceUnavailable, "unavailable", "stand-in is down")
		return
	}
	if id := r.Header.Get("X-Request-Id"); id != "" && !requestIDPattern.MatchString(id) {
		s.violation(w, "X-Request-Id %q does not match %s", id, requestIDPattern)
		return
	}
	// Every route but healthz needs the token on TCP.
	if r.URL.Path != "/v1/healthz" && r.Header.Get("Authorization") != "Bearer "+s.token {
		problem(w, http.StatusUnauthorized, "unauthenticated", "missing or wrong bearer token")
		s.t.Errorf("contract stand-in: %s %s without the bearer token", r.Method, r.URL.Path)
		return
	}
	path := r.URL.Path
	switch {
	case r.Method == http.MethodGet && path == "/v1/healthz":
		writeJSON(w, 200, map[string]string{"status": "ok"})
	case r.Method == http.MethodGet && path == "/v1/info":
		info := map[string]any{
			"version": "stand-in", "api_version": "v1", "vmm": "cloud-hypervisor", "vmm_version": "v0",
			"accel": "kvm", "features": []string{"fork", "idempotency", "lifetimes", "network.egress"},
			"limits": map[string]any{"max_fork_count": 100, "max_sandboxes": 0, "max_timeout_s": 604800,
				"default_timeout_s": 3600, "dead_retention_s": 3600, "pool_size": 0},
			"caller": map[string]any{"tenant": "default", "role": "admin"},
		}
		if s.capacity != nil {
			info["capacity"] = s.capacity
		}
		writeJSON(w, 200, info)
	case r.Method == http.MethodGet && path == "/v1/snapshots":
		s.listSnapshots(w, r)
	case r.Method == http.MethodPost && path == "/v1/snapshots/pull":
		s.pull(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/snapshots/"):
		tag := path[len("/v1/snapshots/"):]
		s.snapshotGets = append(s.snapshotGets, tag)
		mib, ok := s.snapshots[tag]
		if t := r.Header.Get(ActForHeader); t != "" && s.ownerOf(tag) != "default" && s.ownerOf(tag) != t {
			ok = false // another tenant's: as absent
		}
		if !ok {
			problem(w, 404, "not_found", "snapshot "+tag+" not found")
			return
		}
		writeJSON(w, 200, map[string]any{"tag": tag, "memory_mib": mib, "disk_bytes": 0, "state": "ready", "owner": s.ownerOf(tag),
			"pooled_vmms": s.pooled[tag]})
	case r.Method == http.MethodPost && path == "/v1/sandboxes":
		s.fork(w, r)
	case r.Method == http.MethodGet && path == "/v1/sandboxes":
		s.listSandboxes(w, r)
	case strings.HasPrefix(path, "/v1/sandboxes/") && !strings.Contains(path[len("/v1/sandboxes/"):], "/"):
		id := path[len("/v1/sandboxes/"):]
		sb := s.sandboxes[id]
		if sb == nil {
			problem(w, 404, "not_found", "sandbox "+id+" not found")
			return
		}
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, 200, s.sandboxJSON(sb))
		case http.MethodDelete:
			s.deletes = append(s.deletes, id)
			delete(s.sandboxes, id)
			w.WriteHeader(http.StatusNoContent)
		default:
			s.violation(w, "%s %s: the controller calls only GET and DELETE there", r.Method, path)
		}
	default:
		s.violation(w, "%s %s: not a route the controller should call", r.Method, path)
	}
}

func (s *standIn) listSnapshots(w http.ResponseWriter, r *http.Request) {
	if l := r.URL.Query().Get("limit"); l != "" {
		var n int
		if _, err := fmt.Sscan(l, &n); err != nil || n < 1 || n > 1000 {
			s.violation(w, "limit %q outside 1 to 1000", l)
			return
		}
	}
	items := []map[string]any{}
	tags := make([]string, 0, len(s.snapshots))
	for tag := range s.snapshots {
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	for _, tag := range tags {
		items = append(items, map[string]any{
			"tag": tag, "id": "snap-" + tag, "created": time.Unix(0, 0).UTC(), "recipe": "python",
			"image_digest": "sha256:0", "vmm": "cloud-hypervisor", "vmm_version": "v0", "accel": "kvm",
			"memory_mib": s.snapshots[tag], "vcpus": 2, "python": true, "files": map[string]any{},
			"size_bytes": 1 << 30, "disk_bytes": 1 << 28, "create_ms": 1000, "pooled_vmms": s.pooled[tag],
			"state": "ready", "depth": 0, "owner": s.ownerOf(tag),
		})
	}
	writeJSON(w, 200, map[string]any{"items": items})
}

func (s *standIn) fork(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		s.violation(w, "fork Content-Type %q, want application/json", ct)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if len(key) > 255 || strings.IndexFunc(key, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0 {
		s.violation(w, "Idempotency-Key %q: 1 to 255 printable ASCII characters", key)
		return
	}
	tenant := r.Header.Get(ActForHeader)
	if tenant != "" && !tenantPattern.MatchString(tenant) {
		s.violation(w, "%s %q: not a tenant name", ActForHeader, tenant)
		return
	}
	var raw bytes.Buffer
	raw.ReadFrom(r.Body)
	var req standInForkRequest
	dec := json.NewDecoder(bytes.NewReader(raw.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.violation(w, "fork body does not follow ForkRequest: %v", err)
		return
	}
	s.forks = append(s.forks, forkCall{Key: key, Tenant: tenant, Body: req})
	switch {
	case req.Tag == "":
		s.violation(w, "fork: tag is required")
		return
	case req.Count == nil || *req.Count < 1:
		s.violation(w, "fork: count is required, at least 1")
		return
	case req.PullPolicy != "" && req.PullPolicy != "if_not_present" && req.PullPolicy != "always":
		s.violation(w, "fork: pull_policy %q", req.PullPolicy)
		return
	case req.TimeoutS != nil && (*req.TimeoutS < 0 || *req.TimeoutS > 604800):
		s.violation(w, "fork: timeout_s %d outside 0 to 604800", *req.TimeoutS)
		return
	case req.IdleTimeoutS != nil && *req.IdleTimeoutS < 0:
		s.violation(w, "fork: idle_timeout_s %d below 0", *req.IdleTimeoutS)
		return
	case req.CPUs != nil && *req.CPUs < 0.1:
		s.violation(w, "fork: cpus %v below 0.1", *req.CPUs)
		return
	}
	if n := req.Network; n != nil {
		if n.Mode != "none" && n.Mode != "public" && n.Mode != "allow" {
			s.violation(w, "fork: network.mode %q", n.Mode)
			return
		}
		if len(n.Allow) > 256 || n.MaxConnections != nil && (*n.MaxConnections < 0 || *n.MaxConnections > 1048576) ||
			n.RateMbit != nil && (*n.RateMbit < 0 || *n.RateMbit > 100000) {
			s.violation(w, "fork: network out of range: %+v", *n)
			return
		}
	}
	if key != "" {
		if e, ok := s.idem[key]; ok {
			if !bytes.Equal(e.body, raw.Bytes()) {
				problem(w, http.StatusUnprocessableEntity, "invalid_argument", "Idempotency-Key reused with another body")
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(e.resp)
			return
		}
	}
	tag := req.Tag
	if o := s.ownerOf(tag); o != "default" && o != tenant {
		problem(w, 404, "not_found", "no snapshot tagged "+tag)
		return
	}
	if _, ok := s.snapshots[tag]; !ok {
		if !refPattern.MatchString(tag) {
			problem(w, 404, "not_found", "snapshot "+tag+" not found")
			return
		}
		// A registry reference: the daemon pulls it under a ref-- tag.
		tag = "ref--" + fmt.Sprintf("%x", len(tag))
		s.snapshots[tag] = 256
	}
	var out []map[string]any
	for range *req.Count {
		s.next++
		s.created++
		sb := &standInSandbox{ID: fmt.Sprintf("sb-%010d", s.next), Tag: tag, State: "running", Metadata: req.Metadata}
		s.sandboxes[sb.ID] = sb
		out = append(out, s.sandboxJSON(sb))
	}
	resp, _ := json.Marshal(map[string]any{"sandboxes": out, "total_ms": 3.5})
	if key != "" {
		s.idem[key] = idemEntry{body: raw.Bytes(), resp: resp}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(resp)
}

// pull answers POST /v1/snapshots/pull as the daemon does: a registry
// reference kept under tag (or a ref-- tag), 409 when the tag is held.
func (s *standIn) pull(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Ref string `json:"ref"`
		Tag string `json:"tag"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || !refPattern.MatchString(req.Ref) || req.Tag != "" && !tagPattern.MatchString(req.Tag) {
		s.violation(w, "pull body does not follow PullSnapshotRequest: %+v (%v)", req, err)
		return
	}
	s.pulls = append(s.pulls, req.Ref+" as "+req.Tag)
	if s.pullFails {
		problem(w, 404, "not_found", "registry: "+req.Ref+" not found")
		return
	}
	tag := req.Tag
	if tag == "" {
		tag = "ref--" + fmt.Sprintf("%x", len(req.Ref))
	}
	if _, ok := s.snapshots[tag]; ok {
		problem(w, 409, "already_exists", "snapshot "+tag+" exists")
		return
	}
	s.snapshots[tag] = 256
	if t := r.Header.Get(ActForHeader); t != "" {
		if s.owners == nil {
			s.owners = map[string]string{}
		}
		s.owners[tag] = t // the puller's
	}
	writeJSON(w, 201, map[string]any{"tag": tag, "memory_mib": 256, "disk_bytes": 0, "state": "ready", "owner": s.ownerOf(tag)})
}

func (s *standIn) listSandboxes(w http.ResponseWriter, r *http.Request) {
	items := []map[string]any{}
	for _, sb := range s.sandboxes {
		ok := true
		for _, l := range r.URL.Query()["label"] {
			k, v, found := strings.Cut(l, "=")
			if !found {
				s.violation(w, "label %q is not key=value", l)
				return
			}
			ok = ok && sb.Metadata[k] == v
		}
		if ok {
			items = append(items, s.sandboxJSON(sb))
		}
	}
	writeJSON(w, 200, map[string]any{"items": items})
}

// sandboxJSON is the Sandbox schema's required fields and a few more.
func (s *standIn) sandboxJSON(sb *standInSandbox) map[string]any {
	return map[string]any{
		"id": sb.ID, "tag": sb.Tag, "state": sb.State, "created": time.Unix(0, 0).UTC(),
		"ready_ms": 3.1, "pooled": true, "last_activity": time.Unix(0, 0).UTC(), "metadata": sb.Metadata,
	}
}

// counts returns the fork calls, sandboxes created and deletes so far.
func (s *standIn) counts() (forks, created int, deletes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.forks), s.created, append([]string(nil), s.deletes...)
}

func (s *standIn) lastFork() forkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.forks) == 0 {
		s.t.Fatal("no fork call")
	}
	return s.forks[len(s.forks)-1]
}

func (s *standIn) setState(id, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		sb.State = state
	}
}
