package controller

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// HoldsFor says node holds tag ready for tenant: its own, shared with it,
// or public (the operator's, or shared with every tenant).
func (v *NodeView) HoldsFor(node, tag, tenant string) bool {
	s, ok := v.snapshotOn(node, tag)
	return ok && visibleTo(s, tenant)
}

// HeldAnywhere says some node up is known to hold tag ready for tenant.
func (v *NodeView) HeldAnywhere(tag, tenant string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.heldLocked(tag, tenant)
}

func (v *NodeView) heldLocked(tag, tenant string) bool {
	for _, r := range v.nodes {
		if s, ok := r.snapshots[tag]; ok && r.up && visibleTo(s, tenant) {
			return true
		}
	}
	return false
}

// Bounds of FindSnapshot: lookups at once (each asks every node, 16 at a
// time), and how long one may take in all; how long a caller waits for
// one (NodeView.FindWait).
const (
	maxLookups     = 4
	lookupDeadline = 30 * time.Second
	findWait       = time.Second
	// lookupKept is how long a finished lookup answers for Sandboxes made
	// before it began (NodeView.LookupKept).
	lookupKept = 5 * time.Second
)

// lookup is one FindSnapshot fan-out for a tag.
type lookup struct {
	began time.Time
	// tenant is whose Sandbox started it (NodeView.lookingFor).
	tenant string
	done   chan struct{}
	// complete: every node answered or failed within its own timeout
	// (set before done is closed).
	complete bool
}

// FindSnapshot looks for a snapshot no node is known to hold for tenant,
// between polling rounds, so a snapshot made on a node since the last
// round (a sandbox branched through the gateway, then forked) is placed
// at once rather than a round and a retry later: every node up is asked
// for the tag (GET /v1/snapshots/{tag}, 16 at a time) and its ready
// holders are recorded, with who may fork them, in the view and in
// placement. It answers from a lookup that began after since, when the
// Sandbox asking first asked (so after it exists, and after any snapshot
// made before it: no clock but the controller's is compared; its retries
// pass the same since, so a lookup slower than one wait still answers
// them), starting one if none did; callers arriving while one runs share
// the next. At most maxLookups run at once, each within lookupDeadline.
// sure is false unless the lookup heard from every node (the view
// settled, every node it knows up and answering 200 or 404, no copy still
// being written): only then may the tag be called absent.
//
// A reconcile worker is not held for long, nor one namespace's typos
// allowed to hold the lookups others' branches need: a caller waits at
// most FindWait for its answer (the lookup runs on; a retry finds what
// it found), and a tenant with a lookup running starts no other, so one
// whose Sandboxes name many absent tags takes one slot of maxLookups.
// Either way the answer is not sure: the caller asks again soon.
func (v *NodeView) FindSnapshot(ctx context.Context, tag, tenant string, since time.Time) (held, sure bool) {
	wait := time.NewTimer(durationOr(v.FindWait, findWait))
	defer wait.Stop()
	for {
		v.mu.Lock()
		if v.heldLocked(tag, tenant) {
			v.mu.Unlock()
			return true, true
		}
		if v.lookups == nil {
			v.lookups = map[string]*lookup{}
			v.lookupSlots = make(chan struct{}, maxLookups)
		}
		now := time.Now()
		for t, l := range v.lookups {
			select {
			case <-l.done:
				if now.Sub(l.began) > durationOr(v.LookupKept, lookupKept) {
					delete(v.lookups, t)
				}
			default:
			}
		}
		l := v.lookups[tag]
		if l == nil || l.began.Before(since) && isDone(l) {
			if v.lookingFor[tenant] > 0 {
				v.mu.Unlock()
				return false, false // its other lookup first
			}
			if v.lookingFor == nil {
				v.lookingFor = map[string]int{}
			}
			v.lookingFor[tenant]++
			l = &lookup{began: now, tenant: tenant, done: make(chan struct{})}
			v.lookups[tag] = l
			go v.runLookup(ctx, tag, l)
		}
		v.mu.Unlock()
		select {
		case <-l.done:
		case <-wait.C:
			return false, false
		case <-ctx.Done():
			return false, false
		}
		if !l.began.Before(since) {
			held := v.HeldAnywhere(tag, tenant)
			return held, held || l.complete
		}
		// It began too early to answer for this Sandbox: another.
	}
}

func isDone(l *lookup) bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// runLookup asks every node up for tag and records the ready holders.
func (v *NodeView) runLookup(ctx context.Context, tag string, l *lookup) {
	defer func() {
		v.mu.Lock()
		if v.lookingFor[l.tenant]--; v.lookingFor[l.tenant] <= 0 {
			delete(v.lookingFor, l.tenant)
		}
		v.mu.Unlock()
		close(l.done)
	}()
	// Not the first caller's to cancel, others wait on it: the view's
	// (its Start's context), else the caller's without its cancel.
	v.mu.Lock()
	parent := v.runCtx
	v.mu.Unlock()
	if parent == nil {
		parent = context.WithoutCancel(ctx)
	}
	ctx, cancel := context.WithTimeout(parent, lookupDeadline)
	defer cancel()
	select {
	case v.lookupSlots <- struct{}{}:
		defer func() { <-v.lookupSlots }()
	case <-ctx.Done():
		return
	}
	v.mu.Lock()
	type asked struct {
		name   string
		client *NodeClient
	}
	var ask []asked
	everyNode := v.rounds >= v.threshold() // settled: no node unseen
	for name, r := range v.nodes {
		if r.up {
			ask = append(ask, asked{name, r.client})
		} else {
			everyNode = false // discovered, never answered
		}
	}
	v.mu.Unlock()

	timeout := v.PollTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	held := map[int]apiSnapshot{} // by index in ask
	answered := 0                 // 200 ready, or 404
	var mu sync.Mutex
	FanOut(ctx, len(ask), timeout, func(ctx context.Context, i int) {
		s, err := ask[i].client.Snapshot(ctx, tag)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil && s.ready() && s.Tag == tag:
			held[i] = s
			answered++
		case statusOf(err) == http.StatusNotFound:
			answered++
		}
	})

	v.mu.Lock()
	defer v.mu.Unlock()
	l.complete = everyNode && answered == len(ask) && ctx.Err() == nil
	for i, s := range held {
		r := v.nodes[ask[i].name]
		if r == nil || !r.up || r.client != ask[i].client {
			continue // gone or replaced meanwhile: the next round knows
		}
		snaps := make(map[string]apiSnapshot, len(r.snapshots)+1)
		for t, x := range r.snapshots {
			snaps[t] = x
		}
		snaps[tag] = s
		r.snapshots = snaps
		if r.foundAt == nil {
			r.foundAt = map[string]time.Time{}
		}
		r.foundAt[tag] = l.began
		n := r.node(r.failures == 0)
		n.Warm = nil // the poll's pools, not news: placement keeps its count
		v.Cluster.SetNode(n)
	}
}
