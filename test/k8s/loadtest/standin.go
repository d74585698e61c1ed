// Package loadtest runs forkd's Kubernetes controller against a real
// kube-apiserver with many simulated nodes: one in-process HTTP handler
// (FleetStandIn) answers for every node's forkd daemon. The test is in
// load_test.go; docs/SCALE.md has what it measured.
package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// FleetStandIn is a contract stand-in for many nodes' forkd daemons behind
// one http.Handler: node NAME's API root is BASE/n/NAME. It answers only
// the routes the controller calls (GET /v1/healthz, /v1/info,
// /v1/snapshots; POST, GET and DELETE /v1/sandboxes), in the shapes of
// internal/api/openapi.yaml, as cheaply as it can so a 2-core machine can
// serve 1,000 of them. It is not forkd: a fork creates a record, nothing
// runs, and the fork time it reports (total_ms) is the handler's own.
//
// What it checks of the contract: the bearer token, the ForkRequest body
// (no unknown field, tag and count present), the Idempotency-Key (a replay
// with the same body gets the first answer, another body 422). What it
// enforces as the daemon does: a fork of a snapshot the node does not hold
// is 404, and one past the node's guest memory limit is 429 (counted, see
// Usage: the controller should never send one). A request off the
// contract is answered 400, so the sandbox never runs and the test fails.
type FleetStandIn struct {
	token string
	nodes map[string]*standInNode // fixed after NewFleetStandIn
	mux   *http.ServeMux
	// gets counts GET /v1/sandboxes/{id}, every node's.
	gets atomic.Int64
}

// StandInNode describes one simulated node.
type StandInNode struct {
	Name string
	// MemoryLimitBytes is the daemon's guest memory limit (capacity in
	// GET /v1/info); DiskFreeBytes its free disk.
	MemoryLimitBytes, DiskFreeBytes int64
	// Snapshots are the tags it holds, each of SnapshotMemoryMiB.
	Snapshots []string
}

// SnapshotMemoryMiB is every stand-in snapshot's memory_mib: what a fork
// of it commits on its node.
const SnapshotMemoryMiB = 256

type standInNode struct {
	StandInNode
	held      map[string]bool
	snapshots []byte // the GET /v1/snapshots answer, encoded once

	mu        sync.Mutex
	sandboxes map[string]*standInSandbox
	idem      map[string]idemEntry
	// preloaded counts sandboxes the node runs that have no record here
	// (the controller's view preloaded with bare reservations).
	preloaded int
	next      int
	refused   int
}

type standInSandbox struct {
	ID, Tag  string
	Metadata map[string]string
	ForkMs   float64
}

type idemEntry struct{ body, resp []byte }

// NewFleetStandIn makes the stand-in for nodes; token is the bearer token
// every route but healthz requires.
func NewFleetStandIn(token string, nodes []StandInNode) *FleetStandIn {
	f := &FleetStandIn{token: token, nodes: make(map[string]*standInNode, len(nodes)), mux: http.NewServeMux()}
	for _, n := range nodes {
		sn := &standInNode{StandInNode: n, held: map[string]bool{},
			sandboxes: map[string]*standInSandbox{}, idem: map[string]idemEntry{}}
		items := make([]map[string]any, 0, len(n.Snapshots))
		tags := slices.Sorted(slices.Values(n.Snapshots))
		for _, tag := range tags {
			sn.held[tag] = true
			items = append(items, map[string]any{
				"tag": tag, "id": "snap-" + tag, "created": time.Unix(0, 0).UTC(), "recipe": "python",
				"image_digest": "sha256:0", "vmm": "cloud-hypervisor", "vmm_version": "v0", "accel": "kvm",
				"memory_mib": SnapshotMemoryMiB, "vcpus": 2, "python": true, "files": map[string]any{},
				"size_bytes": 1 << 30, "disk_bytes": 1 << 28, "create_ms": 1000, "pooled_vmms": 0,
				"state": "ready", "depth": 0,
			})
		}
		sn.snapshots, _ = json.Marshal(map[string]any{"items": items})
		f.nodes[n.Name] = sn
	}
	f.route("GET /n/{node}/v1/healthz", func(w http.ResponseWriter, r *http.Request, n *standInNode) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	f.route("GET /n/{node}/v1/info", f.info)
	f.route("GET /n/{node}/v1/snapshots", func(w http.ResponseWriter, r *http.Request, n *standInNode) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(n.snapshots)
	})
	f.route("POST /n/{node}/v1/sandboxes", f.fork)
	f.route("GET /n/{node}/v1/sandboxes", f.list)
	f.route("GET /n/{node}/v1/sandboxes/{id}", f.get)
	f.route("DELETE /n/{node}/v1/sandboxes/{id}", f.delete)
	return f
}

// ServeHTTP answers for every node.
func (f *FleetStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) { f.mux.ServeHTTP(w, r) }

func (f *FleetStandIn) route(pattern string, h func(http.ResponseWriter, *http.Request, *standInNode)) {
	f.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		n := f.nodes[r.PathValue("node")]
		if n == nil {
			problem(w, http.StatusNotFound, "not_found", "no such node")
			return
		}
		if !strings.HasSuffix(r.URL.Path, "/v1/healthz") && r.Header.Get("Authorization") != "Bearer "+f.token {
			problem(w, http.StatusUnauthorized, "unauthenticated", "missing or wrong bearer token")
			return
		}
		h(w, r, n)
	})
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

const snapshotBytes = int64(SnapshotMemoryMiB) << 20

// committed is the guest memory the node's sandboxes take; n.mu held.
func (n *standInNode) committed() int64 {
	return int64(len(n.sandboxes)+n.preloaded) * snapshotBytes
}

func (f *FleetStandIn) info(w http.ResponseWriter, r *http.Request, n *standInNode) {
	n.mu.Lock()
	committed, running := n.committed(), len(n.sandboxes)+n.preloaded
	n.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"version": "stand-in", "api_version": "v1", "vmm": "cloud-hypervisor", "vmm_version": "v0",
		"accel": "kvm", "features": []string{"fork", "idempotency", "lifetimes", "network.egress"},
		"limits": map[string]any{"max_fork_count": 100, "max_sandboxes": 0, "max_timeout_s": 604800,
			"default_timeout_s": 3600, "dead_retention_s": 3600, "pool_size": 0},
		"caller": map[string]any{"tenant": "default", "role": "admin"},
		"capacity": map[string]any{
			"guest_memory_committed_bytes": committed, "guest_memory_pooled_bytes": 0,
			"guest_memory_limit_bytes": n.MemoryLimitBytes, "host_memory_total_bytes": n.MemoryLimitBytes,
			"host_memory_available_bytes": n.MemoryLimitBytes - committed,
			"disk_total_bytes":            n.DiskFreeBytes, "disk_free_bytes": n.DiskFreeBytes, "sandboxes_running": running,
		},
	})
}

// forkRequest mirrors the ForkRequest schema, every property, so decoding
// with DisallowUnknownFields is its additionalProperties: false.
type forkRequest struct {
	Tag              string            `json:"tag"`
	Count            *int              `json:"count"`
	PullPolicy       string            `json:"pull_policy,omitempty"`
	RegistryUsername string            `json:"registry_username,omitempty"`
	RegistryPassword string            `json:"registry_password,omitempty"`
	TimeoutS         *int64            `json:"timeout_s,omitempty"`
	IdleTimeoutS     *int64            `json:"idle_timeout_s,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Network          json.RawMessage   `json:"network,omitempty"`
	CPUs             *float64          `json:"cpus,omitempty"`
}

func (f *FleetStandIn) fork(w http.ResponseWriter, r *http.Request, n *standInNode) {
	began := time.Now()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		problem(w, http.StatusUnsupportedMediaType, "invalid_argument", "Content-Type "+ct)
		return
	}
	var raw bytes.Buffer
	raw.ReadFrom(r.Body)
	var req forkRequest
	dec := json.NewDecoder(bytes.NewReader(raw.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Tag == "" || req.Count == nil || *req.Count < 1 {
		problem(w, http.StatusBadRequest, "invalid_argument", fmt.Sprintf("not a ForkRequest: %v", err))
		return
	}
	key := r.Header.Get("Idempotency-Key")
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.idem[key]; ok && key != "" {
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
	if !n.held[req.Tag] {
		problem(w, http.StatusNotFound, "not_found", "snapshot "+req.Tag+" not found")
		return
	}
	if n.committed()+int64(*req.Count)*snapshotBytes > n.MemoryLimitBytes {
		n.refused++
		problem(w, http.StatusTooManyRequests, "resource_exhausted", "guest memory limit reached")
		return
	}
	var made []*standInSandbox
	for range *req.Count {
		n.next++
		sb := &standInSandbox{ID: fmt.Sprintf("sb-%s-%06d", n.Name, n.next), Tag: req.Tag, Metadata: req.Metadata}
		n.sandboxes[sb.ID] = sb
		made = append(made, sb)
	}
	ms := float64(time.Since(began).Microseconds()) / 1000
	out := make([]map[string]any, 0, len(made))
	for _, sb := range made {
		sb.ForkMs = ms
		out = append(out, sandboxJSON(sb))
	}
	resp, _ := json.Marshal(map[string]any{"sandboxes": out, "total_ms": ms})
	if key != "" {
		n.idem[key] = idemEntry{body: raw.Bytes(), resp: resp}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(resp)
}

func (f *FleetStandIn) list(w http.ResponseWriter, r *http.Request, n *standInNode) {
	n.mu.Lock()
	defer n.mu.Unlock()
	items := []map[string]any{}
	for _, sb := range n.sandboxes {
		ok := true
		for _, l := range r.URL.Query()["label"] {
			k, v, _ := strings.Cut(l, "=")
			ok = ok && sb.Metadata[k] == v
		}
		if ok {
			items = append(items, sandboxJSON(sb))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (f *FleetStandIn) get(w http.ResponseWriter, r *http.Request, n *standInNode) {
	f.gets.Add(1)
	n.mu.Lock()
	sb := n.sandboxes[r.PathValue("id")]
	n.mu.Unlock()
	if sb == nil {
		problem(w, http.StatusNotFound, "not_found", "sandbox not found")
		return
	}
	writeJSON(w, http.StatusOK, sandboxJSON(sb))
}

func (f *FleetStandIn) delete(w http.ResponseWriter, r *http.Request, n *standInNode) {
	n.mu.Lock()
	defer n.mu.Unlock()
	id := r.PathValue("id")
	if n.sandboxes[id] == nil {
		problem(w, http.StatusNotFound, "not_found", "sandbox not found")
		return
	}
	delete(n.sandboxes, id)
	w.WriteHeader(http.StatusNoContent)
}

// sandboxJSON is the Sandbox schema's required fields and a few more.
func sandboxJSON(sb *standInSandbox) map[string]any {
	return map[string]any{
		"id": sb.ID, "tag": sb.Tag, "state": "running", "created": time.Unix(0, 0).UTC(),
		"ready_ms": sb.ForkMs, "pooled": false, "last_activity": time.Unix(0, 0).UTC(), "metadata": sb.Metadata,
	}
}

// AddRunning records a sandbox the node runs already (one the test wrote
// into the apiserver as Running there).
func (f *FleetStandIn) AddRunning(node, id, tag string, metadata map[string]string) {
	n := f.nodes[node]
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sandboxes[id] = &standInSandbox{ID: id, Tag: tag, Metadata: metadata}
}

// AddPreloaded counts count sandboxes as running on the node without a
// record (their memory is committed; they cannot be asked about).
func (f *FleetStandIn) AddPreloaded(node string, count int) {
	n := f.nodes[node]
	n.mu.Lock()
	defer n.mu.Unlock()
	n.preloaded += count
}

// Sandbox returns the tag and reported fork time of a sandbox on a node.
func (f *FleetStandIn) Sandbox(node, id string) (tag string, forkMs float64, ok bool) {
	n := f.nodes[node]
	if n == nil {
		return "", 0, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	sb := n.sandboxes[id]
	if sb == nil {
		return "", 0, false
	}
	return sb.Tag, sb.ForkMs, true
}

// Holds says the node holds the snapshot.
func (f *FleetStandIn) Holds(node, tag string) bool {
	n := f.nodes[node]
	return n != nil && n.held[tag]
}

// Usage is a node's committed guest memory, its limit, and the forks it
// refused for lack of room.
func (f *FleetStandIn) Usage(node string) (committed, limit int64, refused int) {
	n := f.nodes[node]
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.committed(), n.MemoryLimitBytes, n.refused
}

// Gets is how many GET /v1/sandboxes/{id} the nodes answered: the
// controller's checks of running sandboxes.
func (f *FleetStandIn) Gets() int64 { return f.gets.Load() }
