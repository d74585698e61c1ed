package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
	"golang.org/x/sync/errgroup"
)

// TestThousandNamespaces sets up and tears down 1,000 sandbox namespaces
// with uplinks, rules and resolvers (no VMs), past the 254 where a /24
// per host would end, and checks that nothing is left: no uplink, no
// namespace mount, no pool address.
func TestThousandNamespaces(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	w := testnet.New(t)
	nw, err := NewNetwork(NetworkConfig{
		Pool: "10.231.64.0/20", HostNS: w.Host.Path(), Table: "forkd-scale", DNSUpstream: testnet.Upstream,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nw.Close()
	c, _ := Policy{Mode: ModeAllow, Allow: []string{"198.51.100.0/24", "*.example.com"}}.Compile(Options{})
	prefix := fmt.Sprintf("fks%d-", os.Getpid())
	atts := make([]*Attachment, n)
	defer func() { // on failure: leave nothing behind either
		for _, a := range atts {
			if a != nil {
				nw.Unlink(a)
				a.NS.Remove()
			}
		}
	}()
	// As an engine's pool refills do, several at once.
	workers := 2 * runtime.NumCPU()
	each := func(fn func(i int) error) time.Duration {
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(workers)
		for i := range n {
			g.Go(func() error { return fn(i) })
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	setUp := each(func(i int) error {
		ns, err := netns.Create(context.Background(), fmt.Sprintf("%s%d", prefix, i), netns.Options{})
		if err != nil {
			return fmt.Errorf("namespace %d: %w", i, err)
		}
		a, err := nw.Link(fmt.Sprintf("sb-s%09d", i), ns, c)
		if err != nil {
			ns.Remove()
			return fmt.Errorf("link %d: %w", i, err)
		}
		atts[i] = a
		return nil
	})
	if got := nw.Pool().InUse(); got != n {
		t.Errorf("%d links in use, want %d", got, n)
	}
	tearDown := each(func(i int) error {
		a := atts[i]
		atts[i] = nil
		return errors.Join(nw.Unlink(a), a.NS.Remove())
	})
	// The kernel deletes the uplinks with their namespaces, in its own
	// time; their addresses come back as they go.
	start := time.Now()
	deadline := start.Add(2 * time.Minute)
	for nw.Draining() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d uplinks still draining two minutes after their namespaces were removed", nw.Draining())
		}
		time.Sleep(10 * time.Millisecond)
	}
	drained := tearDown + time.Since(start)
	t.Logf("%d namespaces with uplink, rules and resolver, %d at a time: set up in %v (%.0f/s), torn down in %v (%.0f/s), all uplinks gone after %v (%.0f/s)",
		n, workers, setUp.Round(time.Millisecond), float64(n)/setUp.Seconds(), tearDown.Round(time.Millisecond), float64(n)/tearDown.Seconds(),
		drained.Round(time.Millisecond), float64(n)/drained.Seconds())
	if up, err := netns.HostUplinks(w.Host.Path(), HostLinkPrefix); err != nil || len(up) != 0 {
		t.Errorf("uplinks left: %v %v", up, err)
	}
	if names, _ := netns.List(prefix); len(names) != 0 {
		t.Errorf("%d namespaces left, e.g. %s", len(names), names[0])
	}
	if nw.Pool().InUse() != 0 {
		t.Errorf("%d pool links still in use", nw.Pool().InUse())
	}
}

// TestLeftoversAfterRestart: a process that dies leaves uplinks and rules;
// the next one claims those of the sandboxes it keeps (their rules still
// work) and removes the rest.
func TestLeftoversAfterRestart(t *testing.T) {
	w := newWorld(t)
	kept := w.sandbox(t, Policy{Mode: ModePublic})
	gone := w.sandbox(t, Policy{Mode: ModePublic})
	kept.mustGet(t, webA)

	// The "restarted daemon": a new Network over the same host namespace.
	next, err := NewNetwork(NetworkConfig{
		Pool: "10.231.0.0/24", HostNS: w.Host.Path(), Table: "forkd-test", DNSUpstream: upstream,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	w.net.Close() // the old one's resolvers die with it
	uplinks, err := next.RemoveLeftovers(map[string]bool{kept.id: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := uplinks[HostLinkName(gone.id)]; ok {
		t.Error("the uplink of a sandbox not kept was not removed")
	}
	if up, _ := netns.HostUplinks(w.Host.Path(), HostLinkPrefix); len(up) != 1 {
		t.Errorf("uplinks after cleanup: %v", up)
	}
	c, _ := Policy{Mode: ModePublic}.Compile(Options{})
	a, err := next.Relink(kept.id, kept.ns, uplinks[HostLinkName(kept.id)], c)
	if err != nil {
		t.Fatal(err)
	}
	if a.Link != kept.link || next.Pool().InUse() != 1 {
		t.Errorf("relinked %+v, want %+v (in use %d)", a.Link, kept.link, next.Pool().InUse())
	}
	kept.mustGet(t, webA)
	if resp, err := kept.lookup(netns.HostAddr+":53", "api.example.org"); err != nil || len(resp.Answer) != 1 {
		t.Errorf("resolver after relink: %v, %v", resp, err)
	}
	// The gone sandbox's address is free again for the next one.
	if l, err := next.Pool().Allocate(); err != nil || l == kept.link {
		t.Errorf("next allocation %+v, %v", l, err)
	}
}

// TestHostChecks: in a host namespace without a default route the check
// says so with the fix; nf_tables works and nothing of the probe stays.
func TestHostChecks(t *testing.T) {
	w := testnet.New(t)
	checks := HostChecks(w.Host.Path(), DefaultPool)
	byName := map[string]Check{}
	for _, c := range checks {
		byName[c.Name] = c
	}
	if c := byName["nf_tables"]; !c.OK {
		t.Errorf("nf_tables: %+v", c)
	}
	if c := byName["default route"]; c.OK || !strings.Contains(c.Fix, "--network-host-netns") {
		t.Errorf("default route in a namespace without one: %+v", c)
	}
	if c := byName["forwarding firewall"]; !c.OK {
		t.Errorf("forwarding firewall in a fresh namespace: %+v", c)
	}
	nc, done, err := nftConn(w.Host.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if tables, _ := nc.ListTables(); len(tables) != 0 {
		t.Errorf("the probe left %d tables", len(tables))
	}
	testnet.AddRoute(t, w.Host, "default", "203.0.113.2")
	for _, c := range HostChecks(w.Host.Path(), DefaultPool) {
		if c.Name == "default route" && !c.OK {
			t.Errorf("with a default route: %+v", c)
		}
	}
}
