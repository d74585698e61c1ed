package controller

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/forkd-dev/forkd/k8s/placement"
)

// NodeState is what the node view knows of a node.
type NodeState int

const (
	// NodeUnknown: never discovered, or removed (lost).
	NodeUnknown NodeState = iota
	// NodeWaiting: discovered, not answered yet (or failing, under the
	// failure threshold, having never answered).
	NodeWaiting
	// NodeUp: has answered a poll; it is in placement.Cluster (Ready or
	// not: a node failing under the threshold stays, not ready).
	NodeUp
)

// NodeView polls every node's forkd daemon into a placement.Cluster. Each
// round it asks Discovery for the daemons, then each daemon for its health
// (GET /v1/healthz, /v1/info: its features and, to the controller's
// admin token, its capacity) and snapshots (GET /v1/snapshots). A node
// that fails FailureThreshold rounds in a row, whether its daemon does not
// answer or discovery no longer lists it, is removed from the cluster and
// OnNodeLost is called: its sandboxes died with it (or with its daemon's
// data, which the controller cannot tell apart).
//
// A daemon pod absent from discovery counts as a failed round, not as an
// instant loss: a DaemonSet rolling update replaces the pod, and the new
// daemon re-adopts the sandboxes the old one left running.
type NodeView struct {
	Cluster   *placement.Cluster
	Discovery Discovery
	// Token is the bearer token sent to every daemon; HTTP the client
	// (TLS settings included).
	Token string
	HTTP  *http.Client
	// Interval between rounds (default 10 s); PollTimeout bounds one
	// node's poll (default 10 s); FailureThreshold rounds failed in a row
	// remove a node (default 6).
	Interval         time.Duration
	PollTimeout      time.Duration
	FailureThreshold int
	// LookupKept is how long a FindSnapshot lookup answers for Sandboxes
	// made before it began (default 5 s); FindWait how long FindSnapshot
	// waits for its lookup (default 1 s).
	LookupKept, FindWait time.Duration
	// OnNodeUp is called (outside the view's lock) when a node answers for
	// the first time, so the sandboxes already placed there are bound
	// again (a controller restart); OnNodeLost when a node is removed,
	// with the keys placement held there.
	OnNodeUp   func(ctx context.Context, node string)
	OnNodeLost func(ctx context.Context, node string, keys []string)
	Log        logr.Logger

	mu     sync.Mutex
	nodes  map[string]*nodeRecord
	rounds int
	// lookups are FindSnapshot's, by tag; lookupSlots bounds how many
	// run at once; lookingFor counts those running by the tenant whose
	// Sandbox started them.
	lookups     map[string]*lookup
	lookupSlots chan struct{}
	lookingFor  map[string]int
	// runCtx is Start's context: lookups end with the view.
	runCtx context.Context
}

type nodeRecord struct {
	ep       NodeEndpoint
	client   *NodeClient
	up       bool // answered once; in the cluster
	failures int
	// snapshots are the ready snapshots it holds, by tag.
	snapshots map[string]apiSnapshot
	// foundAt is when FindSnapshot's lookup that found a tag began: a
	// round that began before then keeps the tag it did not see.
	foundAt  map[string]time.Time
	features map[string]bool
	// capacity is what the daemon last reported of its room (nil: it
	// reports none: an older daemon, or a token without the admin role).
	capacity *apiCapacity
}

func (v *NodeView) threshold() int {
	if v.FailureThreshold > 0 {
		return v.FailureThreshold
	}
	return 6
}

// Settled says the view has polled long enough that a node it does not
// know is lost rather than not yet seen: FailureThreshold rounds.
func (v *NodeView) Settled() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.rounds >= v.threshold()
}

// State returns what the view knows of a node.
func (v *NodeView) State(node string) NodeState {
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.nodes[node]
	switch {
	case r == nil:
		return NodeUnknown
	case r.up:
		return NodeUp
	default:
		return NodeWaiting
	}
}

// Client returns the API client of a node the view knows.
func (v *NodeView) Client(node string) (*NodeClient, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.nodes[node]
	if r == nil {
		return nil, false
	}
	return r.client, true
}

// SupportsIdempotency says the node's daemon lists the idempotency
// feature (GET /v1/info); unknown nodes say false.
func (v *NodeView) SupportsIdempotency(node string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.nodes[node]
	return r != nil && r.features["idempotency"]
}

// Holds says the node reported holding a ready snapshot of that tag.
func (v *NodeView) Holds(node, tag string) bool {
	_, ok := v.snapshotOn(node, tag)
	return ok
}

// snapshotOn is the ready snapshot tag on node, as last seen.
func (v *NodeView) snapshotOn(node, tag string) (apiSnapshot, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if r := v.nodes[node]; r != nil {
		s, ok := r.snapshots[tag]
		return s, ok
	}
	return apiSnapshot{}, false
}

// SnapshotMemoryBytes is the memory size of the snapshot tenant forks as
// tag, as a node holding it reports it (memory_mib): a copy the tenant
// owns or is shared, which placement tries first, else a public one; 0
// when no node holds one the tenant sees. Another tenant's same-named
// snapshot, whatever its size, is not the one forked.
func (v *NodeView) SnapshotMemoryBytes(tag, tenant string) int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	names := make([]string, 0, len(v.nodes))
	for name := range v.nodes {
		names = append(names, name)
	}
	sort.Strings(names) // the same answer every time
	for _, public := range []bool{false, true} {
		for _, name := range names {
			s, ok := v.nodes[name].snapshots[tag]
			if ok && s.MemoryMiB > 0 && visibleTo(s, tenant) && publicSnapshot(s) == public {
				return int64(s.MemoryMiB) << 20
			}
		}
	}
	return 0
}

// Start polls until ctx ends (a manager.Runnable).
func (v *NodeView) Start(ctx context.Context) error {
	interval := v.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	v.mu.Lock()
	v.runCtx = ctx
	v.mu.Unlock()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := v.PollOnce(ctx); err != nil && ctx.Err() == nil {
			v.Log.Error(err, "node discovery failed; keeping the last view")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type pollResult struct {
	node      string
	err       error
	snapshots map[string]apiSnapshot
	features  map[string]bool
	capacity  *apiCapacity
}

// PollOnce runs one round: discovery, then every daemon concurrently.
// A discovery error leaves the view as it was (the apiserver being away
// is no evidence against the nodes) and is returned.
func (v *NodeView) PollOnce(ctx context.Context) error {
	began := time.Now()
	eps, err := v.Discovery.Discover(ctx)
	if err != nil {
		return err
	}
	v.mu.Lock()
	if v.nodes == nil {
		v.nodes = map[string]*nodeRecord{}
	}
	seen := map[string]bool{}
	var todo []*nodeRecord
	for _, ep := range eps {
		seen[ep.Node] = true
		r := v.nodes[ep.Node]
		if r == nil || r.ep.URL != ep.URL {
			hc := v.HTTP
			if hc == nil {
				hc = defaultHTTPClient()
			}
			nr := &nodeRecord{ep: ep, client: &NodeClient{Base: ep.URL, Token: v.Token, HTTP: hc}}
			if r != nil { // a new daemon pod on a known node
				nr.up, nr.failures, nr.snapshots, nr.foundAt, nr.features, nr.capacity = r.up, r.failures, r.snapshots, r.foundAt, r.features, r.capacity
			}
			r = nr
			v.nodes[ep.Node] = r
		}
		r.ep = ep
		todo = append(todo, r)
	}
	v.mu.Unlock()

	results := make([]pollResult, len(todo))
	FanOut(ctx, len(todo), 0, func(ctx context.Context, i int) { // pollNode bounds each
		results[i] = v.pollNode(ctx, todo[i].ep.Node, todo[i].client)
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}

	var ups []string
	type lost struct {
		node string
		keys []string
	}
	var losts []lost
	v.mu.Lock()
	for i, res := range results {
		r := todo[i]
		if v.nodes[res.node] != r {
			continue
		}
		if res.err == nil {
			if !r.up {
				ups = append(ups, res.node)
			}
			r.up, r.failures = true, 0
			for tag, at := range r.foundAt {
				_, seen := res.snapshots[tag]
				if s, ok := r.snapshots[tag]; ok && !seen && at.After(began) {
					res.snapshots[tag] = s // found after this round asked
				} else {
					delete(r.foundAt, tag)
				}
			}
			r.snapshots, r.features, r.capacity = res.snapshots, res.features, res.capacity
			v.Cluster.SetNode(r.node(true))
			continue
		}
		r.failures++
		v.Log.Info("node daemon poll failed", "node", res.node, "failures", r.failures, "error", res.err.Error())
		if r.up {
			v.Cluster.SetNode(r.node(false))
		}
	}
	for name, r := range v.nodes {
		if !seen[name] {
			r.failures++
			if r.up {
				v.Cluster.SetNode(r.node(false))
			}
		}
		if r.failures >= v.threshold() {
			delete(v.nodes, name)
			if r.up {
				losts = append(losts, lost{name, v.Cluster.RemoveNode(name)})
			}
		}
	}
	v.rounds++
	v.mu.Unlock()

	sort.Strings(ups)
	for _, n := range ups {
		if v.OnNodeUp != nil {
			v.OnNodeUp(ctx, n)
		}
	}
	sort.Slice(losts, func(i, j int) bool { return losts[i].node < losts[j].node })
	for _, l := range losts {
		v.Log.Info("node lost", "node", l.node, "sandboxes", len(l.keys))
		if v.OnNodeLost != nil {
			v.OnNodeLost(ctx, l.node, l.keys)
		}
	}
	return nil
}

// node is the placement report of a record.
func (r *nodeRecord) node(ready bool) placement.Node {
	n := placement.Node{
		Name:          r.ep.Node,
		Ready:         ready,
		MemoryBytes:   r.ep.MemoryBytes,
		DiskFreeBytes: r.ep.DiskFreeBytes,
		Snapshots:     placementKeys(r.snapshots),
		Warm:          warmKeys(r.snapshots),
	}
	if c := r.capacity; c != nil {
		n.CommittedBytes = c.GuestMemoryCommittedBytes
		if !r.ep.MemoryPinned {
			// The daemon refuses forks past its limit (none: its RAM).
			limit := c.GuestMemoryLimitBytes
			if limit <= 0 {
				limit = c.HostMemoryTotalBytes
			}
			if limit > 0 && (n.MemoryBytes <= 0 || limit < n.MemoryBytes) {
				n.MemoryBytes = limit
			}
		}
		if !r.ep.DiskPinned {
			n.DiskFreeBytes = c.DiskFreeBytes
		}
	}
	return n
}

// pollNode asks one daemon for its health, features and snapshots.
func (v *NodeView) pollNode(ctx context.Context, node string, c *NodeClient) pollResult {
	timeout := v.PollTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res := pollResult{node: node}
	if res.err = c.Healthz(ctx); res.err != nil {
		return res
	}
	info, err := c.Info(ctx)
	if err != nil {
		res.err = err
		return res
	}
	res.features = map[string]bool{}
	for _, f := range info.Features {
		res.features[f] = true
	}
	res.capacity = info.Capacity
	snaps, err := c.Snapshots(ctx)
	if err != nil {
		res.err = err
		return res
	}
	res.snapshots = map[string]apiSnapshot{}
	for _, s := range snaps {
		if s.ready() { // only a ready snapshot forks
			res.snapshots[s.Tag] = s
		}
	}
	return res
}
