package controller

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// countingDiscovery counts its discoveries and can fail them.
type countingDiscovery struct {
	eps   StaticDiscovery
	calls atomic.Int32
	fail  atomic.Bool
}

func (d *countingDiscovery) Discover(ctx context.Context) ([]NodeEndpoint, error) {
	d.calls.Add(1)
	if d.fail.Load() {
		return nil, errors.New("apiserver away")
	}
	return d.eps.Discover(ctx)
}

// TestAddressBook: lookups (one node, or All) come from the last
// discovery while it is fresh; a miss rediscovers at most once a second;
// a failed discovery keeps the last answer.
func TestAddressBook(t *testing.T) {
	d := &countingDiscovery{eps: StaticDiscovery{{Node: "n1", URL: "https://198.51.100.2:7070"}}}
	b := &AddressBook{Discovery: d, Token: "tok", MaxAge: time.Hour}
	c, ok := b.Client("n1")
	if !ok || c.Base != "https://198.51.100.2:7070" || c.Token != "tok" {
		t.Fatalf("n1: %+v %v", c, ok)
	}
	b.Client("n1")
	if _, ok := b.Client("n2"); ok || d.calls.Load() != 1 {
		t.Fatalf("n2 found %v after %d discoveries; want not found, and no new discovery within a second", ok, d.calls.Load())
	}
	// A node that appears is found once the miss may rediscover.
	d.eps = append(d.eps, NodeEndpoint{Node: "n2", URL: "https://198.51.100.6:7070"})
	b.mu.Lock()
	b.at = b.at.Add(-2 * missRefresh)
	b.mu.Unlock()
	if c, ok := b.Client("n2"); !ok || c.Base != "https://198.51.100.6:7070" || d.calls.Load() != 2 {
		t.Fatalf("n2 after it appeared: %+v %v (%d discoveries)", c, ok, d.calls.Load())
	}
	if all := b.All(); len(all) != 2 || all["n2"].Base != "https://198.51.100.6:7070" || d.calls.Load() != 2 {
		t.Fatalf("All while fresh: %v (%d discoveries), want n1 and n2 from the last", all, d.calls.Load())
	}
	// Stale, and discovery fails: the last answer stands.
	d.fail.Store(true)
	b.MaxAge = time.Nanosecond
	b.mu.Lock()
	b.at = b.at.Add(-2 * missRefresh)
	b.mu.Unlock()
	if c, ok := b.Client("n1"); !ok || c.Base != "https://198.51.100.2:7070" {
		t.Fatalf("n1 with discovery failing: %+v %v; want the last known", c, ok)
	}
	if all := b.All(); len(all) != 2 {
		t.Fatalf("All with discovery failing: %v, want the last known", all)
	}
	calls := d.calls.Load()
	b.Client("n1")
	b.Client("n9")
	if d.calls.Load() != calls {
		t.Fatalf("%d discoveries within a second of a failed one, want none", d.calls.Load()-calls)
	}
}
