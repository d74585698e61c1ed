package egress

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/forkd-dev/forkd/internal/netns"
)

// Bounds of the resolver.
const (
	// upstreamTimeout bounds one upstream exchange.
	upstreamTimeout = 5 * time.Second
	// minOpen is the shortest time an answered address stays open: a
	// guest may cache an answer a little past its TTL.
	minOpen = 60 * time.Second
	// maxOpen caps how long one answer opens an address.
	maxOpen = 24 * time.Hour
)

// Resolver answers the DNS of every sandbox of an engine: a UDP and a TCP
// listener in each namespace, on Layout.Resolver:53 (where the guest's
// queries to any server are redirected). A name the sandbox's policy
// allows is forwarded to Upstream; under ModeAllow the addresses in the
// answer are opened (Rules.Open) before the guest sees it. Other names are
// refused.
type Resolver struct {
	// Upstream is the server queries are forwarded to ("host:port").
	Upstream string
	// HostNS is the namespace upstream queries leave from ("": the
	// process's own), the same as the engine's host side.
	HostNS string
	// AllowReserved: answers in Reserved ranges are opened too.
	AllowReserved bool
	Log           *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*dnsSandbox
}

type dnsSandbox struct {
	id       string
	rules    *Rules
	udp, tcp *dns.Server

	mu     sync.Mutex
	policy *Compiled
	opened map[netip.Addr]time.Time // expiry of each address opened
}

// DefaultUpstream is the first name server of the host's /etc/resolv.conf.
func DefaultUpstream() (string, error) {
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil || len(cc.Servers) == 0 {
		return "", fmt.Errorf("no name server in /etc/resolv.conf; set --network-dns-upstream (config network_dns_upstream)")
	}
	return net.JoinHostPort(cc.Servers[0], cc.Port), nil
}

// Attach starts serving sandbox id, whose namespace is at nsPath and whose
// rules are rules, under policy c. The listeners live in the namespace.
func (r *Resolver) Attach(id, nsPath string, rules *Rules, c *Compiled) error {
	sb := &dnsSandbox{id: id, rules: rules, policy: c, opened: map[netip.Addr]time.Time{}}
	addr := net.JoinHostPort(rules.l.Resolver.String(), strconv.Itoa(ResolverPort))
	var pc net.PacketConn
	var ln net.Listener
	if err := netns.DoPath(nsPath, func() (err error) {
		if pc, err = net.ListenPacket("udp4", addr); err != nil {
			return err
		}
		if ln, err = net.Listen("tcp4", addr); err != nil {
			pc.Close()
		}
		return err
	}); err != nil {
		return fmt.Errorf("egress: resolver for %s: %w", id, err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { r.serve(sb, w, q) })
	sb.udp = &dns.Server{PacketConn: pc, Handler: h, UDPSize: dns.DefaultMsgSize}
	sb.tcp = &dns.Server{Listener: ln, Handler: h, ReadTimeout: upstreamTimeout, MaxTCPQueries: 64}
	go sb.udp.ActivateAndServe()
	go sb.tcp.ActivateAndServe()
	r.mu.Lock()
	if r.sandboxes == nil {
		r.sandboxes = map[string]*dnsSandbox{}
	}
	old := r.sandboxes[id]
	r.sandboxes[id] = sb
	r.mu.Unlock()
	if old != nil {
		old.close()
	}
	return nil
}

// SetPolicy changes what sandbox id's names resolve to; the addresses its
// earlier answers opened are forgotten (Rules.SetPolicy flushes them).
func (r *Resolver) SetPolicy(id string, c *Compiled) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return
	}
	sb.mu.Lock()
	sb.policy, sb.opened = c, map[netip.Addr]time.Time{}
	sb.mu.Unlock()
}

// Detach stops serving sandbox id.
func (r *Resolver) Detach(id string) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	delete(r.sandboxes, id)
	r.mu.Unlock()
	if sb != nil {
		sb.close()
	}
}

// Close stops serving every sandbox.
func (r *Resolver) Close() {
	r.mu.Lock()
	all := r.sandboxes
	r.sandboxes = nil
	r.mu.Unlock()
	for _, sb := range all {
		sb.close()
	}
}

func (sb *dnsSandbox) close() {
	// Shutdown fails on a server whose goroutine has not started yet;
	// closing the sockets ends it either way.
	if sb.udp.Shutdown() != nil {
		sb.udp.PacketConn.Close()
	}
	if sb.tcp.Shutdown() != nil {
		sb.tcp.Listener.Close()
	}
}

func (r *Resolver) serve(sb *dnsSandbox, w dns.ResponseWriter, q *dns.Msg) {
	sb.mu.Lock()
	c := sb.policy
	sb.mu.Unlock()
	if len(q.Question) != 1 || q.Opcode != dns.OpcodeQuery || !c.AllowsName(q.Question[0].Name) {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeRefused)
		w.WriteMsg(m)
		return
	}
	_, isTCP := w.RemoteAddr().(*net.TCPAddr)
	resp, err := r.exchange(q, isTCP)
	if err != nil {
		r.Log.Warn("dns upstream", "sandbox_id", sb.id, "name", q.Question[0].Name, "upstream", r.Upstream, "err", err)
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeServerFailure)
		w.WriteMsg(m)
		return
	}
	if c.Mode == ModeAllow {
		if err := r.open(sb, resp); err != nil {
			// The guest could not connect to what it was told: fail the
			// lookup instead.
			r.Log.Warn("dns: opening answered addresses", "sandbox_id", sb.id, "err", err)
			m := new(dns.Msg)
			m.SetRcode(q, dns.RcodeServerFailure)
			w.WriteMsg(m)
			return
		}
	}
	resp.Id = q.Id
	w.WriteMsg(resp)
}

// open lets the sandbox reach the IPv4 addresses of an answer to an
// allowed name, CNAME chains included, for their TTL (at least minOpen);
// reserved addresses stay closed (a public name answering with a private
// address is DNS rebinding) unless the daemon allows them.
func (r *Resolver) open(sb *dnsSandbox, resp *dns.Msg) error {
	var ttl uint32
	var addrs []netip.Addr
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.A.To4())
		if !ok || sb.rules.l.Pool.Contains(ip) {
			continue
		}
		if !r.AllowReserved && slices.ContainsFunc(Reserved, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			continue
		}
		addrs = append(addrs, ip)
		ttl = max(ttl, a.Hdr.Ttl)
	}
	if len(addrs) == 0 {
		return nil
	}
	life := min(max(time.Duration(ttl)*time.Second, minOpen), maxOpen)
	now := time.Now()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	var refresh []netip.Addr
	for _, a := range addrs {
		if exp, ok := sb.opened[a]; ok && exp.After(now) {
			refresh = append(refresh, a)
		}
	}
	if err := sb.rules.Open(addrs, refresh, life); err != nil {
		return err
	}
	for a, exp := range sb.opened {
		if !exp.After(now) {
			delete(sb.opened, a)
		}
	}
	for _, a := range addrs {
		sb.opened[a] = now.Add(life)
	}
	return nil
}

// exchange forwards q upstream from the host namespace, over TCP when the
// guest asked over TCP or the UDP answer was truncated.
func (r *Resolver) exchange(q *dns.Msg, tcp bool) (*dns.Msg, error) {
	if r.Upstream == "" {
		return nil, errors.New("no upstream name server configured")
	}
	if !tcp {
		resp, err := r.exchangeOver("udp", q)
		if err != nil || !resp.Truncated {
			return resp, err
		}
	}
	return r.exchangeOver("tcp", q)
}

func (r *Resolver) exchangeOver(network string, q *dns.Msg) (*dns.Msg, error) {
	var conn net.Conn
	dial := func() (err error) {
		conn, err = net.DialTimeout(network, r.Upstream, upstreamTimeout)
		return err
	}
	var err error
	if r.HostNS == "" {
		err = dial()
	} else {
		err = netns.DoPath(r.HostNS, dial)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(upstreamTimeout))
	co := &dns.Conn{Conn: conn, UDPSize: dns.DefaultMsgSize}
	out := q.Copy()
	out.Id = dns.Id()
	if err := co.WriteMsg(out); err != nil {
		return nil, err
	}
	for {
		resp, err := co.ReadMsg()
		if err != nil {
			return nil, err
		}
		if resp.Id == out.Id { // a stray or spoofed answer is skipped
			return resp, nil
		}
	}
}
