package controller

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// AddressBook gives a client for each node's daemon as Discovery finds it
// (PodDiscovery reading the manager's cache), without polling the
// daemons: what the cluster gateway needs on every replica, where the
// NodeView, which polls them for placement, runs on the elected one
// only. A lookup is served from the last discovery while it is younger
// than MaxAge (default 5 s); a node it does not name makes a fresh one,
// at most once a second; a failed discovery keeps the last answer and is
// not retried for a second either.
type AddressBook struct {
	Discovery Discovery
	// Token and HTTP are the NodeView's (Options.Token, Options.HTTP).
	Token  string
	HTTP   *http.Client
	MaxAge time.Duration

	mu      sync.Mutex
	at      time.Time
	clients map[string]*NodeClient
}

// missRefresh is how soon after a discovery a miss may make another.
const missRefresh = time.Second

// Client returns a client for node's daemon, or false when discovery
// finds none there.
func (b *AddressBook) Client(node string) (*NodeClient, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	age := time.Since(b.at)
	c, ok := b.clients[node]
	if !b.at.IsZero() && (age < missRefresh || (ok && age < durationOr(b.MaxAge, 5*time.Second))) {
		return c, ok
	}
	b.discoverLocked()
	c, ok = b.clients[node]
	return c, ok
}

// All returns a client for every node's daemon discovery finds, by node
// name, rediscovered when the last discovery is older than MaxAge.
func (b *AddressBook) All() map[string]*NodeClient {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() || time.Since(b.at) >= durationOr(b.MaxAge, 5*time.Second) {
		b.discoverLocked()
	}
	all := make(map[string]*NodeClient, len(b.clients))
	for node, c := range b.clients {
		all[node] = c
	}
	return all
}

// discoverLocked replaces the clients with a fresh discovery's; a failed
// one keeps the last known.
func (b *AddressBook) discoverLocked() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eps, err := b.Discovery.Discover(ctx)
	b.at = time.Now() // a failure too: not rediscovered on every lookup
	if err != nil {
		return
	}
	b.clients = make(map[string]*NodeClient, len(eps))
	for _, ep := range eps {
		b.clients[ep.Node] = &NodeClient{Base: ep.URL, Token: b.Token, HTTP: b.HTTP}
	}
}
