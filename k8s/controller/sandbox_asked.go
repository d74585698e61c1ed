package controller

import (
	"sync"
	"time"
)

// askedSince remembers, per Sandbox (namespace/name), when it first asked
// the node view to look for its snapshot's tag (FindSnapshot), on the
// controller's own clock, until it gets a sure answer or is placed: its
// retries are answered by a lookup begun after that first ask, so one
// slower than FindSnapshot's wait still answers them (else each retry
// would need a lookup begun after it, and a slow one would never do).
type askedSince struct {
	mu sync.Mutex
	m  map[string]asked
}

type asked struct {
	tag string
	at  time.Time
}

// since is when key first asked for tag (now, if this is the first ask,
// or the tag changed).
func (a *askedSince) since(key, tag string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rec, ok := a.m[key]; ok && rec.tag == tag {
		return rec.at
	}
	if a.m == nil {
		a.m = map[string]asked{}
	}
	now := time.Now() // FindSnapshot's clock
	a.m[key] = asked{tag: tag, at: now}
	return now
}

// done ends key's record: answered for sure, placed, or gone.
func (a *askedSince) done(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, key)
}
