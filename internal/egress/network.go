package egress

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
)

// Network is an engine's sandbox networking: the uplink pool, the host's
// rules (installed the first time a sandbox is linked, so an engine whose
// sandboxes are all closed rooms never touches the host) and the
// resolver. Link and Unlink set up and remove one sandbox's part.
type Network struct {
	pool     *Pool
	drain    *drain
	host     *Host
	resolver *Resolver
	layout   Layout
	opts     Options
	log      *slog.Logger

	hostMu        sync.Mutex
	hostInstalled bool
}

// NetworkConfig configures NewNetwork.
type NetworkConfig struct {
	Pool   string // default DefaultPool
	HostNS string // "" for the process's own
	// Table names the engine's host table (one per engine on a host).
	Table       string
	DNSUpstream string // "" for DefaultUpstream
	Options
	Log *slog.Logger
}

// NewNetwork checks cfg and returns the engine's network; nothing on the
// host changes until the first Link.
func NewNetwork(cfg NetworkConfig) (*Network, error) {
	if cfg.Pool == "" {
		cfg.Pool = DefaultPool
	}
	pool, err := NewPool(cfg.Pool)
	if err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Network{
		pool: pool, drain: newDrain(pool, cfg.HostNS, cfg.Log), opts: cfg.Options, log: cfg.Log,
		host:     &Host{NS: cfg.HostNS, Table: cfg.Table, Pool: pool},
		resolver: &Resolver{Upstream: cfg.DNSUpstream, HostNS: cfg.HostNS, AllowReserved: cfg.AllowReserved, Log: cfg.Log},
		layout: Layout{
			Tap: netns.DefaultTap, Uplink: netns.UplinkName,
			Guest: netip.MustParseAddr(netns.GuestAddr), Resolver: netip.MustParseAddr(netns.HostAddr),
			Pool: pool.Network(),
		},
	}, nil
}

// Pool is the uplink pool.
func (n *Network) Pool() *Pool { return n.pool }

// HostNS is the host namespace ("" for the process's own).
func (n *Network) HostNS() string { return n.host.NS }

// Compile checks p against the network's options.
func (n *Network) Compile(p Policy) (*Compiled, error) { return p.Compile(n.opts) }

// Attachment is one sandbox's part: its uplink and rules, and its
// resolver while attached.
type Attachment struct {
	ID    string
	NS    *netns.NS
	Link  Link
	Rules *Rules
}

// ensureHost installs the host's rules once.
func (n *Network) ensureHost() error {
	n.hostMu.Lock()
	defer n.hostMu.Unlock()
	if n.hostInstalled {
		return nil
	}
	if n.resolver.Upstream == "" {
		up, err := DefaultUpstream()
		if err != nil {
			n.log.Warn("sandbox DNS has no upstream: allowed names will fail to resolve", "err", err)
		}
		n.resolver.Upstream = up
	}
	if err := n.host.Install(); err != nil {
		return fmt.Errorf("%w; forkd doctor checks what sandbox networking needs: %w", err, errdefs.ErrFailedPrecondition)
	}
	n.hostInstalled = true
	return nil
}

// Link gives sandbox id (namespace ns) an uplink from the pool, rules
// enforcing c and a resolver. On error nothing of it is left.
func (n *Network) Link(id string, ns *netns.NS, c *Compiled) (_ *Attachment, err error) {
	if err := n.ensureHost(); err != nil {
		return nil, err
	}
	l, err := n.allocate()
	if err != nil {
		return nil, err
	}
	a := &Attachment{ID: id, NS: ns, Link: l, Rules: NewRules(ns.Path(), n.layout, n.opts)}
	defer func() {
		if err != nil {
			// The namespace may stay (a policy change that failed):
			// its uplink goes now, not with it.
			n.resolver.Detach(id)
			netns.RemoveUplink(n.host.NS, HostLinkName(id))
			n.pool.Release(l)
		}
	}()
	if err := ns.AddUplink(n.host.NS, netns.Uplink{
		HostName: HostLinkName(id), HostAddr: netip.PrefixFrom(l.Host, 30), NSAddr: netip.PrefixFrom(l.NS, 30),
	}); err != nil {
		return nil, err
	}
	if err := netns.SetForwarding(ns.Path()); err != nil {
		return nil, err
	}
	if err := a.Rules.Install(c); err != nil {
		return nil, err
	}
	if err := n.resolver.Attach(id, ns.Path(), a.Rules, c); err != nil {
		return nil, err
	}
	return a, nil
}

// Relink takes back the part of a sandbox an earlier process linked: the
// uplink's address (hostAddr, found by HostUplinks) is claimed in the
// pool and the resolver started again; the rules live in the namespace.
func (n *Network) Relink(id string, ns *netns.NS, hostAddr netip.Addr, c *Compiled) (*Attachment, error) {
	l, ok := n.pool.Claim(hostAddr)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: its uplink address %s is outside the pool %s (--network-pool changed?)", id, hostAddr, n.pool.Network())
	}
	a := &Attachment{ID: id, NS: ns, Link: l, Rules: NewRules(ns.Path(), n.layout, n.opts)}
	if err := n.ensureHost(); err != nil {
		n.pool.Release(l)
		return nil, err
	}
	if err := n.resolver.Attach(id, ns.Path(), a.Rules, c); err != nil {
		n.pool.Release(l)
		return nil, err
	}
	return a, nil
}

// SetPolicy replaces an attached sandbox's policy.
func (n *Network) SetPolicy(a *Attachment, c *Compiled) error {
	if err := a.Rules.SetPolicy(c); err != nil {
		return err
	}
	n.resolver.SetPolicy(a.ID, c)
	return nil
}

// allocate takes a link from the pool; an exhausted pool first waits for
// the links of ended sandboxes to drain (see drain).
func (n *Network) allocate() (Link, error) {
	deadline := time.Now().Add(allocateWait)
	for {
		l, err := n.pool.Allocate()
		if err == nil || !errdefs.IsUnavailable(err) {
			return l, err
		}
		left := time.Until(deadline)
		if left <= 0 || !n.drain.wait(left) {
			return Link{}, err
		}
	}
}

// Unlink ends a sandbox's part: its resolver stops at once; its uplink
// goes with its namespace, which the caller removes next, and the
// uplink's address returns to the pool once the kernel has deleted it
// (see drain).
func (n *Network) Unlink(a *Attachment) error {
	n.resolver.Detach(a.ID)
	n.drain.add(HostLinkName(a.ID), a.Link)
	return nil
}

// Draining is the number of ended sandboxes' uplinks not yet gone.
func (n *Network) Draining() int { return n.drain.pending() }

// RemoveLeftovers deletes the host-side uplinks in the pool whose
// sandbox is not in keep (ids), and returns the others' addresses by
// sandbox link name for Relink.
func (n *Network) RemoveLeftovers(keep map[string]bool) (map[string]netip.Addr, error) {
	uplinks, err := netns.HostUplinks(n.host.NS, HostLinkPrefix)
	if err != nil {
		return nil, err
	}
	owned := map[string]bool{}
	for id := range keep {
		owned[HostLinkName(id)] = true
	}
	for name, addr := range uplinks {
		if owned[name] || !addr.IsValid() || !n.pool.Network().Contains(addr) {
			continue
		}
		if err := netns.RemoveUplink(n.host.NS, name); err != nil {
			n.log.Warn("removing leftover sandbox uplink", "link", name, "err", err)
		}
		delete(uplinks, name)
	}
	return uplinks, nil
}

// Close stops the resolver; uplinks and rules stay for sandboxes that
// outlive the process.
func (n *Network) Close() {
	n.drain.stop()
	n.resolver.Close()
}

// RemoveHost deletes the host's rules, for an engine whose sandboxes all
// ended with it (a bench, a daemon run with --stop-sandboxes).
func (n *Network) RemoveHost() error {
	n.hostMu.Lock()
	defer n.hostMu.Unlock()
	if !n.hostInstalled {
		return nil
	}
	n.hostInstalled = false
	return n.host.Remove()
}
