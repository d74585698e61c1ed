package controller

import (
	"context"
	"sync"
	"time"
)

// HeldAnywhere says some node up is known to hold tag ready.
func (v *NodeView) HeldAnywhere(tag string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, r := range v.nodes {
		if _, ok := r.snapshots[tag]; ok && r.up {
			return true
		}
	}
	return false
}

// findEvery is how often FindSnapshot may ask the nodes for one tag.
const findEvery = 5 * time.Second

// FindSnapshot looks for a snapshot no node is known to hold, between
// polling rounds: every node up is asked for the tag (GET
// /v1/snapshots/{tag}, 16 at a time) and those holding it ready are
// recorded as holders, in the view and in placement. So a snapshot made
// on a node since the last round (a sandbox branched through the
// gateway, then forked) is placed at once rather than a round and a
// retry later. It reports whether it found a holder the view did not
// know. A tag some node is known to hold is not looked for (a full
// holder is no reason to ask), nor one looked for in the last findEvery:
// a fan-out over every node per unknown tag at most every 5 s.
func (v *NodeView) FindSnapshot(ctx context.Context, tag string) bool {
	v.mu.Lock()
	if v.found == nil {
		v.found = map[string]time.Time{}
	}
	now := time.Now()
	if last, ok := v.found[tag]; ok && now.Sub(last) < findEvery {
		v.mu.Unlock()
		return false
	}
	for t, at := range v.found { // keep the map to recent tags
		if now.Sub(at) >= findEvery {
			delete(v.found, t)
		}
	}
	v.found[tag] = now
	ask := map[string]*NodeClient{}
	for name, r := range v.nodes {
		if _, ok := r.snapshots[tag]; ok && r.up {
			v.mu.Unlock()
			return false
		}
		if r.up {
			ask[name] = r.client
		}
	}
	v.mu.Unlock()

	timeout := v.PollTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	held := map[string]apiSnapshot{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for name, c := range ask {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if s, err := c.Snapshot(cctx, tag); err == nil && s.ready() && s.Tag == tag {
				mu.Lock()
				held[name] = s
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	v.mu.Lock()
	defer v.mu.Unlock()
	added := false
	for name, s := range held {
		r := v.nodes[name]
		if r == nil || !r.up || r.client != ask[name] {
			continue // gone or replaced meanwhile: the next round knows
		}
		snaps := make(map[string]apiSnapshot, len(r.snapshots)+1)
		for t, x := range r.snapshots {
			snaps[t] = x
		}
		snaps[tag] = s
		r.snapshots = snaps
		v.Cluster.SetNode(r.node(r.failures == 0))
		added = true
	}
	return added
}
