// Package placement picks the node a sandbox is forked on: one that holds
// the snapshot and has the memory, else one with the memory and the disk
// to pull the snapshot to first.
//
// Cluster is the controller's view of the nodes (what each node's forkd
// daemon reports) and of the memory reserved by the sandboxes placed on
// them. A decision costs O(nodes holding the snapshot), or O(nodes) when
// it has to pull; never O(sandboxes): each node keeps the sum of its
// reservations, updated as sandboxes are placed and released.
package placement

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// ErrNoCapacity is returned when no ready node can take a sandbox.
var ErrNoCapacity = errors.New("no node can take the sandbox")

// ErrPlaced is Place's answer to a Request with OnlyNew for a key that
// holds a reservation already.
var ErrPlaced = errors.New("the sandbox is placed already")

// Node is what a node's forkd daemon reports about itself.
type Node struct {
	Name string
	// Ready is false while the node is cordoned, draining or not reporting.
	Ready bool
	// MemoryBytes is the memory forkd may give sandboxes on the node.
	MemoryBytes int64
	// CommittedBytes is the guest memory the daemon reports committed
	// (sandboxes running and starting), those placed here included. What
	// it holds beyond placement's reservations when reported (sandboxes
	// forked on the node directly, not through the controller) is taken
	// from the node's room until the next report. A fork placed but not
	// started when the report was read hides as much of that until then;
	// the daemon's own admission (429) is the backstop.
	CommittedBytes int64
	// DiskFreeBytes is the room left for pulled snapshots.
	DiskFreeBytes int64
	// Snapshots are the tags of the snapshots the node holds.
	Snapshots []string
	// Warm counts, by snapshot tag, the VMMs the node reported ready in
	// its pool for that snapshot: a fork there starts from one instead of
	// restoring a VMM first. Among holders with room, placement prefers
	// the one with the most VMMs left, counting its own placements down
	// until the next report. Nil: no report of the pools (what placement
	// counts stays); a map, even empty, is one.
	Warm map[string]int
}

// Request is one sandbox to place.
type Request struct {
	// Key identifies the sandbox (namespace/name) for Release.
	Key string
	// Snapshot is the tag it forks from.
	Snapshot string
	// MemoryBytes is the memory to reserve for it.
	MemoryBytes int64
	// Pullable says the snapshot has an image a node can pull it from;
	// SnapshotBytes is the disk that takes (0: unknown, not checked).
	Pullable      bool
	SnapshotBytes int64
	// Also are other snapshot keys the sandbox may fork as well, tried
	// after Snapshot's holders (held only: never pulled under them): the
	// controller's key of a tag every namespace may fork, after the key of
	// the tag held for the sandbox's namespace alone.
	Also []string
	// Occupied is a key whose holders cannot take a pull of Snapshot: the
	// node holds the tag already, for someone else (the controller's
	// "#TAG"; one name per tag per node).
	Occupied string
	// OnlyNew asks for a decision only for a key with no reservation: a
	// placed key gets ErrPlaced instead of its first decision (a caller
	// that may give the reservation back must not give back another's).
	OnlyNew bool
}

// Decision is where a sandbox goes.
type Decision struct {
	Node string
	// Pull is true when the node does not hold the snapshot yet: it is
	// pulling it (for this sandbox or an earlier one) before the fork.
	Pull bool
}

type node struct {
	Node
	reserved int64
	// foreign is what the daemon had committed beyond reserved when it
	// last reported.
	foreign int64
	// pulling are the tags placement sent here to be pulled, until the
	// node reports holding them.
	pulling map[string]struct{}
	// sandboxes are the keys placed here, so losing the node costs
	// O(its sandboxes), not O(every sandbox).
	sandboxes map[string]struct{}
	// warm is Warm less the forks placed here since the report.
	warm map[string]int
}

func (n *node) free() int64 { return n.MemoryBytes - n.reserved - n.foreign }

// nodeSet is a set of nodes iterated as a slice: a decision walks one, so
// iteration is what must be fast; adding and removing are O(1).
type nodeSet struct {
	list []*node
	pos  map[*node]int
}

func (s *nodeSet) add(n *node) {
	if _, ok := s.pos[n]; ok {
		return
	}
	if s.pos == nil {
		s.pos = map[*node]int{}
	}
	s.pos[n] = len(s.list)
	s.list = append(s.list, n)
}

func (s *nodeSet) remove(n *node) {
	i, ok := s.pos[n]
	if !ok {
		return
	}
	last := s.list[len(s.list)-1]
	s.list[i], s.pos[last] = last, i
	s.list[len(s.list)-1] = nil
	s.list = s.list[:len(s.list)-1]
	delete(s.pos, n)
}

func (s *nodeSet) len() int { return len(s.list) }

type placed struct {
	n     *node
	bytes int64
	pull  bool
}

// Cluster is safe for concurrent use. A decision and its reservation are
// made under one lock, so concurrent placements never overcommit a node.
type Cluster struct {
	mu    sync.Mutex
	nodes map[string]*node
	all   nodeSet
	// holders and pulling index the nodes by snapshot tag.
	holders   map[string]*nodeSet
	pulling   map[string]*nodeSet
	sandboxes map[string]placed
}

// New returns an empty cluster view.
func New() *Cluster {
	return &Cluster{
		nodes:     map[string]*node{},
		holders:   map[string]*nodeSet{},
		pulling:   map[string]*nodeSet{},
		sandboxes: map[string]placed{},
	}
}

// SetNode adds a node or replaces what it reported; the sandboxes placed on
// it stay reserved.
func (c *Cluster) SetNode(info Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[info.Name]
	if n == nil {
		n = &node{pulling: map[string]struct{}{}, sandboxes: map[string]struct{}{}}
		c.nodes[info.Name] = n
		c.all.add(n)
	}
	// Reports repeat: index only what changed.
	now := make(map[string]struct{}, len(info.Snapshots))
	for _, tag := range info.Snapshots {
		now[tag] = struct{}{}
	}
	for _, tag := range n.Snapshots {
		if _, ok := now[tag]; !ok {
			unindex(c.holders, tag, n)
		}
	}
	for tag := range now {
		index(c.holders, tag, n)
		if _, ok := n.pulling[tag]; ok { // the pull finished
			delete(n.pulling, tag)
			unindex(c.pulling, tag, n)
		}
	}
	n.Node = info
	n.Snapshots = append([]string(nil), info.Snapshots...)
	if info.Warm != nil || n.warm == nil {
		n.warm = make(map[string]int, len(info.Warm))
		for tag, k := range info.Warm {
			if k > 0 {
				n.warm[tag] = k
			}
		}
	}
	n.foreign = max(0, info.CommittedBytes-n.reserved)
}

// RemoveNode forgets a node and returns the keys of the sandboxes that were
// on it, now lost, sorted; their reservations go with the node.
func (c *Cluster) RemoveNode(name string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[name]
	if n == nil {
		return nil
	}
	delete(c.nodes, name)
	c.all.remove(n)
	for _, tag := range n.Snapshots {
		unindex(c.holders, tag, n)
	}
	for tag := range n.pulling {
		unindex(c.pulling, tag, n)
	}
	lost := make([]string, 0, len(n.sandboxes))
	for key := range n.sandboxes {
		lost = append(lost, key)
		delete(c.sandboxes, key)
	}
	slices.Sort(lost)
	return lost
}

// PullFailed forgets that a node is pulling a snapshot, so later sandboxes
// of that snapshot are not sent to wait for it there. Those already placed
// keep their decision: the controller re-places them.
func (c *Cluster) PullFailed(nodeName, tag string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[nodeName]; n != nil {
		delete(n.pulling, tag)
		unindex(c.pulling, tag, n)
	}
}

// Bind records a sandbox already running on a node (the controller
// rebuilding its view after a restart) and reserves its memory.
func (c *Cluster) Bind(key, nodeName string, memoryBytes int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[nodeName]
	if n == nil {
		return fmt.Errorf("bind %s to node %q: the node has not reported: add it with SetNode first", key, nodeName)
	}
	c.releaseLocked(key)
	c.reserveLocked(key, n, memoryBytes, false)
	return nil
}

// Release frees a sandbox's reservation; an unknown key is a no-op.
func (c *Cluster) Release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releaseLocked(key)
}

// Place picks a node for req and reserves req.MemoryBytes there. Placing a
// key again returns its first decision. In order of preference: the ready
// node holding the snapshot with the most pooled VMMs left for it
// (Node.Warm), then the most free memory; a node already pulling it; the
// ready node with the most free memory (and the disk) to pull it to. Ties
// go to the node whose name sorts first, so a decision is reproducible.
func (c *Cluster) Place(req Request) (Decision, error) {
	if req.MemoryBytes < 0 {
		return Decision{}, fmt.Errorf("place %s: negative memory %d", req.Key, req.MemoryBytes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.sandboxes[req.Key]; ok {
		if req.OnlyNew {
			return Decision{}, fmt.Errorf("place %s: %w (on node %s)", req.Key, ErrPlaced, p.n.Name)
		}
		return Decision{Node: p.n.Name, Pull: p.pull}, nil
	}
	fits := func(n *node) bool { return n.Ready && n.free() >= req.MemoryBytes }
	for i := -1; i < len(req.Also); i++ {
		key := req.Snapshot
		if i >= 0 {
			key = req.Also[i]
		}
		if n := best(c.holders[key], fits, key); n != nil {
			if n.warm[key] > 0 {
				n.warm[key]--
			}
			c.reserveLocked(req.Key, n, req.MemoryBytes, false)
			return Decision{Node: n.Name}, nil
		}
	}
	if n := best(c.pulling[req.Snapshot], fits, req.Snapshot); n != nil {
		c.reserveLocked(req.Key, n, req.MemoryBytes, true)
		return Decision{Node: n.Name, Pull: true}, nil
	}
	if !req.Pullable {
		return Decision{}, fmt.Errorf("%w: no ready node holding snapshot %q has %d bytes free, and it has no image to pull it from",
			ErrNoCapacity, req.Snapshot, req.MemoryBytes)
	}
	var n *node
	occupied := c.holders[req.Occupied]
	for _, cand := range c.all.list {
		if occupied != nil && req.Occupied != "" {
			if _, ok := occupied.pos[cand]; ok {
				continue
			}
		}
		if fits(cand) && cand.DiskFreeBytes >= req.SnapshotBytes && better(cand, n) {
			n = cand
		}
	}
	if n == nil {
		return Decision{}, fmt.Errorf("%w: no ready node has %d bytes of memory and %d of disk free for snapshot %q",
			ErrNoCapacity, req.MemoryBytes, req.SnapshotBytes, req.Snapshot)
	}
	n.pulling[req.Snapshot] = struct{}{}
	index(c.pulling, req.Snapshot, n)
	c.reserveLocked(req.Key, n, req.MemoryBytes, true)
	return Decision{Node: n.Name, Pull: true}, nil
}

// best returns the node of set that fits with the most pooled VMMs left
// for key, then the most free memory (so a burst spreads over the pools
// rather than emptying one). Nodes pulling key hold no pool for it: among
// them, the most free memory.
func best(set *nodeSet, fits func(*node) bool, key string) *node {
	if set == nil {
		return nil
	}
	var b *node
	for _, n := range set.list {
		if !fits(n) {
			continue
		}
		if b == nil || n.warm[key] > b.warm[key] || n.warm[key] == b.warm[key] && better(n, b) {
			b = n
		}
	}
	return b
}

// better orders candidates: more free memory, then the smaller name.
func better(n, than *node) bool {
	if than == nil {
		return true
	}
	if n.free() != than.free() {
		return n.free() > than.free()
	}
	return n.Name < than.Name
}

func (c *Cluster) reserveLocked(key string, n *node, bytes int64, pull bool) {
	n.reserved += bytes
	n.sandboxes[key] = struct{}{}
	c.sandboxes[key] = placed{n: n, bytes: bytes, pull: pull}
}

func (c *Cluster) releaseLocked(key string) {
	if p, ok := c.sandboxes[key]; ok {
		p.n.reserved -= p.bytes
		delete(p.n.sandboxes, key)
		delete(c.sandboxes, key)
	}
}

func index(idx map[string]*nodeSet, tag string, n *node) {
	set := idx[tag]
	if set == nil {
		set = &nodeSet{}
		idx[tag] = set
	}
	set.add(n)
}

func unindex(idx map[string]*nodeSet, tag string, n *node) {
	if set := idx[tag]; set != nil {
		set.remove(n)
		if set.len() == 0 {
			delete(idx, tag)
		}
	}
}
