package egress

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names in a sandbox namespace's ruleset.
const (
	// TableName is the table forkd owns in every sandbox namespace.
	TableName = "forkd"
	// ResolverPort is where the namespace's resolver listens (on the
	// tap's address); every DNS query the guest sends is redirected there.
	ResolverPort = 53

	chainForward = "forward"
	chainPolicy  = "policy"
	chainLimits  = "limits"
	dnsSet       = "dns"
	blockedSet   = "blocked"

	// Counters, read by Stats.
	ctrTx      = "tx"
	ctrRx      = "rx"
	ctrDenied  = "denied"
	ctrSpoofed = "spoofed"
)

// Layout is what a sandbox namespace looks like to its rules.
type Layout struct {
	Tap      string     // the guest's link (netns.DefaultTap)
	Uplink   string     // the uplink veth (netns.UplinkName)
	Guest    netip.Addr // the guest's only valid source address
	Resolver netip.Addr // the tap's address, where the resolver listens
	// Pool is the uplinks' network: other sandboxes, never reachable.
	Pool netip.Prefix
}

// Rules applies rules to one sandbox namespace.
type Rules struct {
	nsPath string
	l      Layout
	o      Options
	table  *nftables.Table
}

// NewRules returns the rules of the namespace bind-mounted at nsPath.
func NewRules(nsPath string, l Layout, o Options) *Rules {
	return &Rules{nsPath: nsPath, l: l, o: o, table: &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}}
}

func (r *Rules) conn() (*nftables.Conn, func(), error) { return nftConn(r.nsPath) }

// nftConn opens an nftables connection into the namespace bind-mounted at
// path ("" for the process's own); done closes what it opened.
func nftConn(path string) (_ *nftables.Conn, done func(), _ error) {
	if path == "" {
		c, err := nftables.New()
		if err != nil {
			return nil, nil, fmt.Errorf("egress: nftables: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("egress: namespace %s: %w", path, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("egress: nftables: %w", err)
	}
	return c, func() { unix.Close(fd) }, nil
}

// Install replaces the namespace's table with a fresh one enforcing c, in
// one transaction: the guest is never without rules once it has any.
func (r *Rules) Install(c *Compiled) error {
	nc, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	t := r.table
	nc.AddTable(t)
	nc.DelTable(t)
	nc.AddTable(t)
	for _, name := range []string{ctrTx, ctrRx, ctrDenied, ctrSpoofed} {
		nc.AddObj(&nftables.CounterObj{Table: t, Name: name})
	}
	// An ID of our own: nftables v0.3.0 numbers sets without one from an
	// unguarded package variable, a data race when sandboxes are linked
	// concurrently. It only names the set within this transaction.
	if err := nc.AddSet(&nftables.Set{ID: 1, Table: t, Name: dnsSet, KeyType: nftables.TypeIPAddr, HasTimeout: true}, nil); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	// What no policy opens, one lookup instead of a rule per range: a
	// dozen rules fewer to commit for each sandbox, and to walk for each
	// packet a guest sends.
	blocked := []netip.Prefix{r.l.Pool}
	if !r.o.AllowReserved {
		blocked = append(blocked, Reserved...)
	}
	if err := nc.AddSet(&nftables.Set{ID: 2, Table: t, Name: blockedSet, KeyType: nftables.TypeIPAddr, Interval: true, Constant: true},
		intervals(blocked)); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	accept := nftables.ChainPolicyAccept
	drop := nftables.ChainPolicyDrop
	fwd := nc.AddChain(&nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	pol := nc.AddChain(&nftables.Chain{Name: chainPolicy, Table: t})
	lim := nc.AddChain(&nftables.Chain{Name: chainLimits, Table: t})
	in := nc.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Before conntrack and NAT, for the namespace itself (its resolver)
	// as for what it forwards: a spoofed query would make the resolver
	// answer, through the uplink, whatever address the guest named.
	raw := nc.AddChain(&nftables.Chain{Name: "antispoof", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	pre := nc.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	post := nc.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})

	add := func(ch *nftables.Chain, ex ...expr.Any) { nc.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ex}) }
	tap, up := r.l.Tap, r.l.Uplink
	guest := netip.PrefixFrom(r.l.Guest, 32)
	tcp, udp := byte(unix.IPPROTO_TCP), byte(unix.IPPROTO_UDP)

	add(raw, cat(ifname(true, tap, false), ipaddr(true, guest, true), []expr.Any{count(ctrSpoofed), verdict(expr.VerdictDrop)})...)

	// forward: what the guest sends out, and the answers.
	add(fwd, cat(ifname(true, tap, false), []expr.Any{count(ctrTx)})...)
	add(fwd, cat(ifname(false, tap, false), []expr.Any{count(ctrRx)})...)
	add(fwd, jump(chainLimits)) // rate caps apply to established traffic too
	add(fwd, cat(ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})...)
	add(fwd, cat(ifname(true, tap, true), []expr.Any{verdict(expr.VerdictDrop)})...) // nothing opens a connection to the guest
	add(fwd, jump(chainPolicy))
	add(fwd, cat(l4proto(tcp), []expr.Any{count(ctrDenied), rejectTCP()})...)
	add(fwd, count(ctrDenied), rejectICMP())

	// input: from the uplink nothing but replies; from the guest, replies
	// (the port proxy dials into it), its DNS queries (redirected to the
	// resolver below), ICMP (a ping of its gateway) and nothing else: a
	// socket some day bound to any address in the namespace is not the
	// guest's to reach. Refused like forwarded traffic, and counted.
	add(in, cat(ifname(true, up, false), ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})...)
	add(in, cat(ifname(true, up, false), []expr.Any{verdict(expr.VerdictDrop)})...)
	add(in, cat(ifname(true, tap, false), ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})...)
	for _, p := range []byte{udp, tcp} {
		add(in, cat(ifname(true, tap, false), ipaddr(false, netip.PrefixFrom(r.l.Resolver, 32), false), l4proto(p),
			dports(ResolverPort, ResolverPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	}
	add(in, cat(ifname(true, tap, false), l4proto(unix.IPPROTO_ICMP), []expr.Any{verdict(expr.VerdictAccept)})...)
	add(in, cat(ifname(true, tap, false), l4proto(tcp), []expr.Any{count(ctrDenied), rejectTCP()})...)
	add(in, cat(ifname(true, tap, false), []expr.Any{count(ctrDenied), rejectICMP()})...)

	// prerouting: every DNS query goes to forkd's resolver, whatever
	// server the guest asked.
	for _, p := range []byte{udp, tcp} {
		add(pre, cat(ifname(true, tap, false), l4proto(p), dports(53, 53), dnat4(r.l.Resolver, ResolverPort))...)
	}
	// postrouting: the guest's address (the same in every sandbox) leaves
	// as the uplink's.
	add(post, cat(ifname(false, up, false), []expr.Any{&expr.Masq{}})...)

	r.policyRules(nc, pol, c)
	r.limitRules(nc, lim, c)
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("egress: install rules in %s: %w", r.nsPath, err)
	}
	return nil
}

// policyRules adds the rules of c to the (empty) policy chain: accept
// what c allows; return (to the reject that follows the jump) otherwise.
func (r *Rules) policyRules(nc *nftables.Conn, pol *nftables.Chain, c *Compiled) {
	t := r.table
	add := func(ex ...expr.Any) { nc.AddRule(&nftables.Rule{Table: t, Chain: pol, Exprs: ex}) }
	ret := []expr.Any{verdict(expr.VerdictReturn)}
	acc := []expr.Any{verdict(expr.VerdictAccept)}
	if c.Mode == ModeNone {
		return
	}
	add(cat(daddrIn(blockedSet), ret)...)
	if c.Mode == ModePublic {
		add(acc...)
		return
	}
	for _, n := range c.Nets {
		dst := ipaddr(false, n.Prefix, false)
		if n.PortLo == 0 && n.Proto == "" {
			add(cat(dst, acc)...)
			continue
		}
		for _, p := range []string{"tcp", "udp"} {
			if n.Proto != "" && n.Proto != p {
				continue
			}
			proto := byte(unix.IPPROTO_TCP)
			if p == "udp" {
				proto = unix.IPPROTO_UDP
			}
			m := cat(dst, l4proto(proto))
			if n.PortLo != 0 {
				m = cat(m, dports(n.PortLo, n.PortHi))
			}
			add(cat(m, acc)...)
		}
	}
	if len(c.Domains) > 0 {
		add(cat(daddrIn(dnsSet), acc)...)
	}
}

// limitRules adds c's caps to the (empty) limits chain, which the forward
// chain jumps to before it accepts established traffic: a rate cap per
// direction (the kernel's bucket holds a second of the rate plus a burst
// of a tenth of a second, at least 64 KiB), and a cap on the guest's TCP
// connections, counted as each opens.
func (r *Rules) limitRules(nc *nftables.Conn, lim *nftables.Chain, c *Compiled) {
	add := func(ex ...expr.Any) { nc.AddRule(&nftables.Rule{Table: r.table, Chain: lim, Exprs: ex}) }
	tap := r.l.Tap
	if c.RateMbit > 0 {
		rate := uint64(c.RateMbit) * 1_000_000 / 8
		burst := uint32(max(rate/10, 64<<10))
		for _, iif := range []bool{true, false} {
			add(cat(ifname(iif, tap, false), []expr.Any{
				&expr.Limit{Type: expr.LimitTypePktBytes, Rate: rate, Unit: expr.LimitTimeSecond, Burst: burst, Over: true},
				count(ctrDenied), verdict(expr.VerdictDrop),
			})...)
		}
	}
	if c.MaxConnections > 0 {
		add(cat(ifname(true, tap, false), ctNew(), []expr.Any{
			&expr.Connlimit{Count: uint32(c.MaxConnections), Flags: 1 /* NFT_CONNLIMIT_F_INV: over */},
			count(ctrDenied), rejectTCP(),
		})...)
	}
}

// SetPolicy replaces the policy of a namespace whose rules are installed,
// in one transaction; addresses opened by earlier answers are forgotten.
func (r *Rules) SetPolicy(c *Compiled) error {
	nc, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	pol := &nftables.Chain{Name: chainPolicy, Table: r.table}
	nc.FlushChain(pol)
	nc.FlushSet(&nftables.Set{Table: r.table, Name: dnsSet})
	r.policyRules(nc, pol, c)
	lim := &nftables.Chain{Name: chainLimits, Table: r.table}
	nc.FlushChain(lim)
	r.limitRules(nc, lim, c)
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("egress: set policy in %s: %w", r.nsPath, err)
	}
	return nil
}

// Open lets the guest reach addrs (answers of an allowed name) for ttl.
// refresh lists those of addrs the set holds already (their timeout is
// replaced: an element added again keeps its old one).
func (r *Rules) Open(addrs, refresh []netip.Addr, ttl time.Duration) error {
	if len(addrs) == 0 {
		return nil
	}
	nc, done, err := r.conn()
	if err != nil {
		return err
	}
	defer done()
	s := &nftables.Set{Table: r.table, Name: dnsSet, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	elems := func(as []netip.Addr) []nftables.SetElement {
		out := make([]nftables.SetElement, 0, len(as))
		for _, a := range as {
			b := a.As4()
			out = append(out, nftables.SetElement{Key: b[:], Timeout: ttl})
		}
		return out
	}
	if len(refresh) > 0 {
		if err := nc.SetDeleteElements(s, elems(refresh)); err != nil {
			return err
		}
	}
	if err := nc.SetAddElements(s, elems(addrs)); err != nil {
		return err
	}
	err = nc.Flush()
	if err != nil && len(refresh) > 0 {
		// One of refresh expired meanwhile: the delete failed the batch.
		if err = nc.SetAddElements(s, elems(addrs)); err == nil {
			err = nc.Flush()
		}
	}
	if err != nil {
		return fmt.Errorf("egress: open %v in %s: %w", addrs, r.nsPath, err)
	}
	return nil
}

// Stats are a sandbox's traffic counters.
type Stats struct {
	TxBytes   uint64 `json:"tx_bytes"`
	RxBytes   uint64 `json:"rx_bytes"`
	TxPackets uint64 `json:"tx_packets"`
	RxPackets uint64 `json:"rx_packets"`
	// Denied counts packets the policy refused; Spoofed those sent with
	// another source address than the guest's.
	Denied  uint64 `json:"denied_packets"`
	Spoofed uint64 `json:"spoofed_packets"`
}

// Stats reads the namespace's counters.
func (r *Rules) Stats() (Stats, error) {
	nc, done, err := r.conn()
	if err != nil {
		return Stats{}, err
	}
	defer done()
	objs, err := nc.GetObjects(r.table) // as CounterObj
	if err != nil {
		return Stats{}, fmt.Errorf("egress: counters in %s: %w", r.nsPath, err)
	}
	var s Stats
	for _, o := range objs {
		c, ok := o.(*nftables.CounterObj)
		if !ok {
			continue
		}
		switch c.Name {
		case ctrTx:
			s.TxBytes, s.TxPackets = c.Bytes, c.Packets
		case ctrRx:
			s.RxBytes, s.RxPackets = c.Bytes, c.Packets
		case ctrDenied:
			s.Denied = c.Packets
		case ctrSpoofed:
			s.Spoofed = c.Packets
		}
	}
	return s, nil
}
