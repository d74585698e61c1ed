package egress

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
)

// The test's world is testnet's (namespaces it makes; no packet reaches
// any other address), with the engine's host side installed in its host
// namespace. A veth named like the tap stands in for it: the guest's
// packets take the same path through the sandbox namespace's rules as a
// VMM's would.

type world struct {
	*testnet.World
	net *Network
}

const (
	webA     = testnet.WebA
	webB     = testnet.WebB
	upstream = testnet.Upstream
	trapPriv = testnet.TrapPriv
	trapMeta = testnet.TrapMeta
	hostSvc  = testnet.HostSvc
)

var seq atomic.Int32

func newWorld(t *testing.T) *world {
	w := &world{World: testnet.New(t)}
	var err error
	w.net, err = NewNetwork(NetworkConfig{
		Pool: "10.231.0.0/24", HostNS: w.Host.Path(), Table: "forkd-test", DNSUpstream: upstream,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.net.Close)
	return w
}

// sandbox is one sandbox namespace with a guest namespace behind "tap0".
type sandbox struct {
	id        string
	ns, guest *netns.NS
	att       *Attachment
	rules     *Rules
	link      Link
	w         *world
}

func (w *world) sandbox(t *testing.T, p Policy) *sandbox {
	t.Helper()
	sb := &sandbox{w: w, ns: testnet.NS(t, "sb"), guest: testnet.NS(t, "guest")}
	sb.id = fmt.Sprintf("sb-t%d", seq.Add(1))
	// The guest's side: a veth named and addressed as the tap, the guest
	// at its other end.
	testnet.Veth(t, sb.ns, netns.DefaultTap, netns.HostAddr+"/30", sb.guest, "eth0", netns.GuestAddr+"/30")
	testnet.AddRoute(t, sb.guest, "default", netns.HostAddr)

	c, err := p.Compile(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.setUp(t, c); err != nil {
		t.Fatal(err)
	}
	return sb
}

// setUp links the sandbox as the engine does.
func (sb *sandbox) setUp(t *testing.T, c *Compiled) error {
	att, err := sb.w.net.Link(sb.id, sb.ns, c)
	if err != nil {
		return err
	}
	t.Cleanup(func() { sb.w.net.Unlink(att) })
	sb.att, sb.rules, sb.link = att, att.Rules, att.Link
	return nil
}

func (sb *sandbox) setPolicy(t *testing.T, p Policy) {
	t.Helper()
	c, err := p.Compile(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.w.net.SetPolicy(sb.att, c); err != nil {
		t.Fatal(err)
	}
}

// get fetches http://addr/ from the guest; "" and the error if it fails.
func (sb *sandbox) get(addr string) (string, error) {
	var body string
	err := sb.guest.Do(func() error {
		d := net.Dialer{Timeout: 20 * time.Second}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
		b, err := io.ReadAll(c)
		if i := strings.Index(string(b), "\r\n\r\n"); i >= 0 {
			body = string(b[i+4:])
		}
		return err
	})
	return body, err
}

// lookup asks server (any address: the guest's queries are redirected)
// for name's A record from the guest.
func (sb *sandbox) lookup(server, name string) (*dns.Msg, error) {
	var resp *dns.Msg
	err := sb.guest.Do(func() error {
		c, err := net.DialTimeout("udp4", server, 20*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		co := &dns.Conn{Conn: c}
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		if err := co.WriteMsg(q); err != nil {
			return err
		}
		resp, err = co.ReadMsg()
		return err
	})
	return resp, err
}

func (sb *sandbox) mustGet(t *testing.T, addr string) {
	t.Helper()
	if body, err := sb.get(addr); err != nil || body != "hello from "+addr {
		t.Errorf("GET %s from the guest = %q, %v; want it served", addr, body, err)
	}
}

// mustNotGet: the connection is refused at once (a reset or an ICMP
// error from the sandbox's rules), not left to time out.
func (sb *sandbox) mustNotGet(t *testing.T, addr string) {
	t.Helper()
	if body, err := sb.get(addr); err == nil {
		t.Errorf("GET %s from the guest = %q; want it refused", addr, body)
	} else if strings.Contains(err.Error(), "timeout") {
		t.Errorf("GET %s from the guest timed out; want it refused at once", addr)
	}
}

func TestPublic(t *testing.T) {
	w := newWorld(t)
	sb := w.sandbox(t, Policy{Mode: ModePublic})
	other := w.sandbox(t, Policy{Mode: ModePublic})
	testnet.ServeHTTP(t, other.ns, other.link.NS.String()+":7000")

	sb.mustGet(t, webA)
	sb.mustGet(t, webB)
	// Never the host (its address on any link, its loopback through it),
	// private ranges, cloud metadata, nor another sandbox.
	sb.mustNotGet(t, trapPriv)
	sb.mustNotGet(t, trapMeta)
	sb.mustNotGet(t, hostSvc)
	sb.mustNotGet(t, sb.link.Host.String()+":9999")
	sb.mustNotGet(t, other.link.NS.String()+":7000")
	sb.mustNotGet(t, "127.0.0.1:9998") // the guest's own loopback: nothing there
	// DNS: any name, through the upstream.
	resp, err := sb.lookup(netns.HostAddr+":53", "api.example.org")
	if err != nil || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "198.51.100.20" {
		t.Errorf("lookup in public mode = %v, %v", resp, err)
	}
	st, err := sb.rules.Stats()
	if err != nil || st.TxPackets == 0 || st.RxBytes == 0 || st.Denied == 0 {
		t.Errorf("stats = %+v, %v; want traffic both ways and denials", st, err)
	}
}

// TestNamespaceClosedToGuest: a service listening on every address of a
// sandbox's own namespace is not the guest's to reach, at the tap's
// address or the uplink's, under any policy; its DNS still is, and the
// refusals are counted.
func TestNamespaceClosedToGuest(t *testing.T) {
	w := newWorld(t)
	sb := w.sandbox(t, Policy{Mode: ModePublic})
	testnet.ServeHTTP(t, sb.ns, "0.0.0.0:7070")
	before, err := sb.rules.Stats()
	if err != nil {
		t.Fatal(err)
	}
	sb.mustNotGet(t, netns.HostAddr+":7070")
	sb.mustNotGet(t, sb.link.NS.String()+":7070")
	if resp, err := sb.lookup(netns.HostAddr+":53", "api.example.org"); err != nil || len(resp.Answer) != 1 {
		t.Errorf("DNS from the guest: %v, %v", resp, err)
	}
	sb.mustGet(t, webA)
	after, err := sb.rules.Stats()
	if err != nil || after.Denied < before.Denied+2 {
		t.Errorf("denied %d -> %d (%v); want both refusals counted", before.Denied, after.Denied, err)
	}
}

func TestAllowList(t *testing.T) {
	w := newWorld(t)
	sb := w.sandbox(t, Policy{Mode: ModeAllow, Allow: []string{"198.51.100.20:8080/tcp", "allowed.example.com", "*.example.org", "rebind.example.com"}})

	sb.mustGet(t, webB)
	// Not yet resolved: closed.
	sb.mustNotGet(t, webA)
	resp, err := sb.lookup(netns.HostAddr+":53", "allowed.example.com")
	if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("lookup of an allowed name = %v, %v", resp, err)
	}
	sb.mustGet(t, webA)
	// A name not on the list is refused, whichever server the guest asks:
	// the query is answered inside the sandbox and never leaves it.
	for _, server := range []string{netns.HostAddr + ":53", "198.51.100.99:53", upstream} {
		resp, err := sb.lookup(server, "other.example.com")
		if err != nil || resp.Rcode != dns.RcodeRefused {
			t.Errorf("lookup of a name not allowed via %s = %v, %v; want REFUSED", server, resp, err)
		}
	}
	// Wildcards match names below, not the name itself.
	if resp, err := sb.lookup(netns.HostAddr+":53", "api.example.org"); err != nil || resp.Rcode != dns.RcodeSuccess {
		t.Errorf("wildcard lookup = %v, %v", resp, err)
	}
	if resp, err := sb.lookup(netns.HostAddr+":53", "example.org"); err != nil || resp.Rcode != dns.RcodeRefused {
		t.Errorf("wildcard's apex = %v, %v; want REFUSED", resp, err)
	}
	// An allowed name answering with a reserved address (DNS rebinding to
	// the metadata service) opens nothing.
	if _, err := sb.lookup(netns.HostAddr+":53", "rebind.example.com"); err != nil {
		t.Fatal(err)
	}
	sb.mustNotGet(t, trapMeta)
	// Only the listed port of an address entry.
	sb.mustNotGet(t, "198.51.100.20:80")

	// Changed on the running sandbox: to none, everything closes.
	sb.setPolicy(t, Policy{Mode: ModeNone})
	sb.mustNotGet(t, webA)
	sb.mustNotGet(t, webB)
	if resp, err := sb.lookup(netns.HostAddr+":53", "allowed.example.com"); err != nil || resp.Rcode != dns.RcodeRefused {
		t.Errorf("lookup under none = %v, %v; want REFUSED", resp, err)
	}
	// And to public.
	sb.setPolicy(t, Policy{Mode: ModePublic})
	sb.mustGet(t, webA)
	sb.mustNotGet(t, trapPriv)
}

func TestNone(t *testing.T) {
	w := newWorld(t)
	sb := w.sandbox(t, Policy{Mode: ModeNone})
	sb.mustNotGet(t, webA)
	sb.mustNotGet(t, hostSvc)
	if resp, err := sb.lookup(netns.HostAddr+":53", "allowed.example.com"); err != nil || resp.Rcode != dns.RcodeRefused {
		t.Errorf("lookup under none = %v, %v; want REFUSED", resp, err)
	}
}

// TestSpoofedSource: a packet from the guest with any other source address
// is dropped and counted.
func TestSpoofedSource(t *testing.T) {
	w := newWorld(t)
	sb := w.sandbox(t, Policy{Mode: ModePublic})
	testnet.AddAddr(t, sb.guest, "eth0", "172.31.0.9/32")
	err := sb.guest.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("172.31.0.9")}}
		c, err := d.Dial("tcp4", webA)
		if err == nil {
			c.Close()
			return fmt.Errorf("a connection from a spoofed source went through")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// Nor does the namespace itself answer one: a spoofed query would make
	// the resolver send its answer out of the uplink to whoever was named.
	err = sb.guest.Do(func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP("172.31.0.9")}, &net.UDPAddr{IP: net.ParseIP(netns.HostAddr), Port: 53})
		if err != nil {
			return err
		}
		defer c.Close()
		q := new(dns.Msg)
		q.SetQuestion("api.example.org.", dns.TypeA)
		b, _ := q.Pack()
		c.Write(b)
		// A negative check: nothing can be waited for instead.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(make([]byte, 512)); err == nil {
			return fmt.Errorf("the resolver answered a spoofed query (%d bytes)", n)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if st, err := sb.rules.Stats(); err != nil || st.Spoofed < 2 {
		t.Errorf("stats = %+v, %v; want spoofed packets counted", st, err)
	}
	sb.mustGet(t, webA) // the guest's own address still works
}

// TestLimits: a connection cap refuses one connection more (and lets one
// in again once another closed); a rate cap makes a download take at
// least as long as the rate allows (a lower bound: a loaded machine can
// only be slower).
func TestLimits(t *testing.T) {
	w := newWorld(t)
	sb := w.sandbox(t, Policy{Mode: ModePublic, MaxConnections: 3})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	dial := func() (net.Conn, error) {
		var c net.Conn
		err := sb.guest.Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: 20 * time.Second}).Dial("tcp4", webA)
			return err
		})
		return c, err
	}
	for i := range 3 {
		c, err := dial()
		if err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		held = append(held, c)
	}
	if c, err := dial(); err == nil {
		c.Close()
		t.Error("a fourth connection went through a cap of 3")
	} else if strings.Contains(err.Error(), "timeout") {
		t.Errorf("the fourth connection timed out; want it refused at once: %v", err)
	}
	held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := dial()
		if err == nil {
			held = append(held, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection within a minute of one closing: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// 8 Mbit/s is 1 MB/s; the kernel's bucket holds a second of it plus
	// the burst (a tenth of a second): 4 MB take at least (4 - 1.1) s.
	sb.setPolicy(t, Policy{Mode: ModePublic, RateMbit: 8})
	start := time.Now()
	var got int64
	err := sb.guest.Do(func() error {
		c, err := net.DialTimeout("tcp4", webA, 20*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Minute))
		fmt.Fprintf(c, "GET /bytes/4000000 HTTP/1.0\r\nHost: x\r\n\r\n")
		got, err = io.Copy(io.Discard, c)
		return err
	})
	took := time.Since(start)
	if err != nil || got < 4000000 {
		t.Fatalf("download under a rate cap: %d bytes, %v", got, err)
	}
	if took < 2800*time.Millisecond {
		t.Errorf("4 MB at 8 Mbit/s took %v, want at least 2.8 s", took)
	}
	t.Logf("4 MB at 8 Mbit/s took %v", took)
}
