package sandbox

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/state"
)

// NetworkConfig configures sandbox networking (internal/egress).
type NetworkConfig struct {
	// Default is the policy of sandboxes whose fork and snapshot name
	// none; unset means none.
	Default egress.Policy
	// Pool is the network sandbox uplinks are numbered from (default
	// egress.DefaultPool). Engines sharing a host namespace use disjoint
	// pools.
	Pool string
	// HostNS is the namespace sandbox uplinks lead to and their DNS is
	// forwarded from (a bind mount such as /run/netns/uplink); "" for the
	// daemon's own.
	HostNS string
	// DNSUpstream is the server allowed names are resolved with
	// ("host:port"); "" for the host's first /etc/resolv.conf server.
	DNSUpstream string
	// AllowReserved lets policies open private, loopback, link-local and
	// multicast ranges (an administrator's choice, never a request's).
	AllowReserved bool
}

// network is the engine's part of sandbox networking: an egress.Network
// and the policy resolution rules (fork, else snapshot, else default).
type network struct {
	cfg NetworkConfig
	log *slog.Logger
	*egress.Network

	startOnce    sync.Once
	startUplinks map[string]netip.Addr
}

func newNetwork(cfg NetworkConfig, netnsPrefix string, log *slog.Logger) (*network, error) {
	if cfg.Default.IsZero() {
		cfg.Default = egress.Policy{Mode: egress.ModeNone}
	}
	table := "forkd"
	if p := strings.Trim(netnsPrefix, "-"); p != "forkd" {
		table = "forkd-" + p
	}
	nw, err := egress.NewNetwork(egress.NetworkConfig{
		Pool: cfg.Pool, HostNS: cfg.HostNS, Table: table, DNSUpstream: cfg.DNSUpstream,
		Options: egress.Options{AllowReserved: cfg.AllowReserved}, Log: log,
	})
	if err != nil {
		return nil, err
	}
	n := &network{cfg: cfg, log: log, Network: nw}
	if _, err := n.Compile(cfg.Default); err != nil {
		return nil, fmt.Errorf("default network policy: %w", err)
	}
	return n, nil
}

// resolve picks a sandbox's policy: the fork's, else the snapshot's, else
// the daemon's default; and checks it.
func (n *network) resolve(fork, snap *egress.Policy) (egress.Policy, *egress.Compiled, error) {
	p := n.cfg.Default
	switch {
	case fork != nil && !fork.IsZero():
		p = *fork
	case snap != nil && !snap.IsZero():
		p = *snap
	}
	c, err := n.Compile(p)
	return p, c, err
}

// sbNet is one sandbox's network: its policy and, once a policy other
// than none was applied, its attachment (uplink, rules, resolver).
type sbNet struct {
	id string
	ns *netns.NS

	mu     sync.Mutex
	policy egress.Policy
	att    *egress.Attachment
}

func newSandboxNet(id string, ns *netns.NS) *sbNet {
	return &sbNet{id: id, ns: ns, policy: egress.Policy{Mode: egress.ModeNone}}
}

// samePolicy reports whether a and b allow the same (as written).
func samePolicy(a, b egress.Policy) bool {
	return a.Mode == b.Mode && slices.Equal(a.Allow, b.Allow) && a.MaxConnections == b.MaxConnections && a.RateMbit == b.RateMbit
}

// Policy is the sandbox's current policy.
func (sn *sbNet) Policy() egress.Policy {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	return sn.policy
}

// apply gives the sandbox policy p (compiled c). The first policy other
// than none links the sandbox; later ones replace its rules in one
// transaction. A failure leaves the sandbox as it was.
func (n *network) apply(sn *sbNet, p egress.Policy, c *egress.Compiled) error {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	switch {
	case sn.att != nil:
		if err := n.SetPolicy(sn.att, c); err != nil {
			return fmt.Errorf("sandbox %s: network: %w", sn.id, err)
		}
	case c.Mode != egress.ModeNone:
		att, err := n.Link(sn.id, sn.ns, c)
		if err != nil {
			return fmt.Errorf("sandbox %s: network: %w", sn.id, err)
		}
		sn.att = att
	}
	sn.policy = p
	return nil
}

// readopt takes back the network of a sandbox an earlier daemon left
// running (uplinks: the host's uplink addresses by link name). A sandbox
// whose uplink is gone gets its policy applied afresh.
func (n *network) readopt(sn *sbNet, p egress.Policy, uplinks map[string]netip.Addr) error {
	c, err := n.Compile(p)
	if err != nil {
		return err
	}
	name := egress.HostLinkName(sn.id)
	addr, ok := uplinks[name]
	if !ok || !addr.IsValid() {
		if ok {
			netns.RemoveUplink(n.HostNS(), name)
		}
		return n.apply(sn, p, c)
	}
	att, err := n.Relink(sn.id, sn.ns, addr, c)
	if err != nil {
		return err
	}
	sn.mu.Lock()
	sn.policy, sn.att = p, att
	sn.mu.Unlock()
	return nil
}

// release unlinks the sandbox; its namespace goes with the sandbox.
func (n *network) release(sn *sbNet) error {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.att == nil {
		return nil
	}
	err := n.Unlink(sn.att)
	sn.att = nil
	return err
}

// stats reads the sandbox's counters (zero before it was linked).
func (sn *sbNet) stats() (egress.Stats, error) {
	sn.mu.Lock()
	att := sn.att
	sn.mu.Unlock()
	if att == nil {
		return egress.Stats{}, nil
	}
	return att.Rules.Stats()
}

// readoptNetwork rebuilds the network state of a recorded sandbox being
// adopted (see network.readopt). Its namespace is reached through its VMM,
// which lives in it, and named again: the name the earlier daemon made
// may have gone with that daemon's mount namespace (netns.OpenProcess).
// Everything after (ports, egress rules and DNS, counters, teardown) uses
// that name.
func (e *Engine) readoptNetwork(rec state.SandboxRecord) (*sbNet, error) {
	ns, err := netns.OpenProcess(rec.NetNS, netns.Process{PID: rec.Process.PID, StartTime: rec.Process.StartTime}, rec.NetNSInode)
	if err != nil {
		return nil, err
	}
	sn := newSandboxNet(rec.ID, ns)
	if rec.Network == nil || rec.Network.IsZero() {
		return sn, nil // none, as recorded before policies existed
	}
	return sn, e.net.readopt(sn, *rec.Network, e.net.uplinksAtStart())
}

// uplinksAtStart lists the host's sandbox uplinks once, for adoption.
func (n *network) uplinksAtStart() map[string]netip.Addr {
	n.startOnce.Do(func() {
		var err error
		if n.startUplinks, err = netns.HostUplinks(n.HostNS(), egress.HostLinkPrefix); err != nil {
			n.log.Warn("listing sandbox uplinks", "err", err)
		}
	})
	return n.startUplinks
}

// SetNetwork changes the egress policy of a running sandbox, in one
// transaction of its rules; the addresses its earlier DNS answers opened
// are closed (the guest resolves again).
func (e *Engine) SetNetwork(id string, p egress.Policy) (egress.Policy, error) {
	s, err := e.Get(id)
	if err != nil {
		return egress.Policy{}, err
	}
	c, err := e.net.Compile(p)
	if err != nil {
		return egress.Policy{}, err
	}
	s.mu.Lock()
	st := s.state
	s.mu.Unlock()
	if st != apiv1.StateRunning || s.net == nil {
		return egress.Policy{}, fmt.Errorf("sandbox %s is %s: only a running sandbox's network can change: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if err := e.net.apply(s.net, p, c); err != nil {
		return egress.Policy{}, err
	}
	if err := e.persist(s); err != nil {
		return egress.Policy{}, err
	}
	return p, nil
}

// NetworkInfo is a sandbox's policy and, when withStats, its counters.
func (s *Sandbox) NetworkInfo(withStats bool) *apiv1.SandboxNetwork {
	if s.net == nil {
		return nil
	}
	p := s.net.Policy()
	out := &apiv1.SandboxNetwork{Policy: apiv1.NetworkPolicy{Mode: string(p.Mode), Allow: p.Allow, MaxConnections: p.MaxConnections, RateMbit: p.RateMbit}}
	if withStats {
		if st, err := s.net.stats(); err == nil {
			out.Stats = &apiv1.NetworkStats{
				TxBytes: st.TxBytes, RxBytes: st.RxBytes, TxPackets: st.TxPackets, RxPackets: st.RxPackets,
				DeniedPackets: st.Denied, SpoofedPackets: st.Spoofed,
			}
		}
	}
	return out
}
