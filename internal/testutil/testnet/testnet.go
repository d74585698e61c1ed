// Package testnet builds a test's own network world out of namespaces: a
// host namespace for sandbox uplinks (an engine's NetworkConfig.HostNS)
// and an "internet" namespace behind it with HTTP and DNS servers on
// documentation addresses, plus trap servers on a private address and on
// 169.254.169.254 that a sandbox must never reach. Nothing a test sends
// through it can leave the namespaces it made:
//
//	host ns (203.0.113.1/24, no default route) ── veth ── internet ns (203.0.113.2/24)
//
// The host namespace routes only 198.51.100.0/24, 10.99.0.0/24 and
// 169.254.169.254 to the internet namespace.
package testnet

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// Addresses of the world's servers. Each HTTP server answers
// "hello from ADDR".
const (
	WebA     = "198.51.100.10:80"
	WebB     = "198.51.100.20:8080"
	Upstream = "198.51.100.53:53" // DNS: see Zone
	TrapPriv = "10.99.0.1:80"
	TrapMeta = "169.254.169.254:80"
	HostAddr = "203.0.113.1"
	HostSvc  = HostAddr + ":9999" // on the host namespace itself
)

// Zone is what the world's DNS server answers (A records, TTL 5 s).
var Zone = map[string]string{
	"allowed.example.com.": "198.51.100.10",
	"api.example.org.":     "198.51.100.20",
	"other.example.com.":   "198.51.100.20",
	"rebind.example.com.":  "169.254.169.254",
}

var seq atomic.Int32

// NS makes a plain namespace (no tap) removed when the test ends.
func NS(t testing.TB, role string) *netns.NS {
	t.Helper()
	ns := TapNS(t, role)
	h := Handle(t, ns)
	if tap, err := h.LinkByName(netns.DefaultTap); err == nil {
		h.LinkDel(tap)
	}
	return ns
}

// TapNS makes a namespace as a sandbox's is made (lo and a tap).
func TapNS(t testing.TB, role string) *netns.NS {
	t.Helper()
	testutil.RequiresRoot(t)
	name := fmt.Sprintf("fkn%d-%d-%s", os.Getpid(), seq.Add(1), role)
	ns, err := netns.Create(context.Background(), name, netns.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	return ns
}

// Handle is a netlink handle inside ns.
func Handle(t testing.TB, ns *netns.NS) *netlink.Handle {
	t.Helper()
	var h *netlink.Handle
	if err := ns.Do(func() (err error) { h, err = netlink.NewHandle(); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// Veth links a (link an, address aa) and b (bn, ba); an empty address
// leaves that end without one.
func Veth(t testing.TB, a *netns.NS, an, aa string, b *netns.NS, bn, ba string) {
	t.Helper()
	ha, hb := Handle(t, a), Handle(t, b)
	bfd, err := os.Open(b.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer bfd.Close()
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: an}, PeerName: bn, PeerNamespace: netlink.NsFd(int(bfd.Fd()))}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		h          *netlink.Handle
		name, addr string
	}{{ha, an, aa}, {hb, bn, ba}} {
		l, err := s.h.LinkByName(s.name)
		if err != nil {
			t.Fatal(err)
		}
		if s.addr != "" {
			a, _ := netlink.ParseAddr(s.addr)
			if err := s.h.AddrAdd(l, a); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// AddAddr adds addr (CIDR) to link in ns.
func AddAddr(t testing.TB, ns *netns.NS, link, addr string) {
	t.Helper()
	h := Handle(t, ns)
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(addr)
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
}

// AddRoute routes dst ("default" or a CIDR) via gw in ns.
func AddRoute(t testing.TB, ns *netns.NS, dst, gw string) {
	t.Helper()
	h := Handle(t, ns)
	r := &netlink.Route{Gw: net.ParseIP(gw)}
	if dst != "default" {
		_, r.Dst, _ = net.ParseCIDR(dst)
	}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("route %s via %s: %v", dst, gw, err)
	}
}

// ServeHTTP answers "hello from ADDR" on addr inside ns, and N zero bytes
// for /bytes/N.
func ServeHTTP(t testing.TB, ns *netns.NS, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", addr); return }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/bytes/")); err == nil && n <= 1<<30 {
			w.Header().Set("Content-Length", strconv.Itoa(n))
			io.CopyN(w, zeros{}, int64(n))
			return
		}
		fmt.Fprintf(w, "hello from %s", addr)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// ServeDNS answers A queries from zone inside ns on addr (UDP and TCP).
func ServeDNS(t testing.TB, ns *netns.NS, addr string, zone map[string]string) {
	t.Helper()
	var pc net.PacketConn
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		if pc, err = net.ListenPacket("udp4", addr); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if ip, ok := zone[strings.ToLower(q.Question[0].Name)]; ok && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip)})
		} else if !ok {
			m.SetRcode(q, dns.RcodeNameError)
		}
		w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() {
			if srv.Shutdown() != nil {
				if pc := srv.PacketConn; pc != nil {
					pc.Close()
				}
				if ln := srv.Listener; ln != nil {
					ln.Close()
				}
			}
		})
	}
}

// World is a host namespace with an internet behind it.
type World struct {
	Host, Inet *netns.NS
}

// New builds the world described in the package comment.
func New(t testing.TB) *World {
	t.Helper()
	w := &World{Host: NS(t, "host"), Inet: NS(t, "inet")}
	Veth(t, w.Host, "wan0", HostAddr+"/24", w.Inet, "wan0", "203.0.113.2/24")
	for _, a := range []string{"198.51.100.10/32", "198.51.100.20/32", "198.51.100.53/32", "10.99.0.1/32", "169.254.169.254/32"} {
		AddAddr(t, w.Inet, "lo", a)
	}
	for _, dst := range []string{"198.51.100.0/24", "10.99.0.0/24", "169.254.169.254/32"} {
		AddRoute(t, w.Host, dst, "203.0.113.2")
	}
	for _, a := range []string{WebA, WebB, TrapPriv, TrapMeta} {
		ServeHTTP(t, w.Inet, a)
	}
	ServeHTTP(t, w.Host, HostSvc)
	ServeHTTP(t, w.Host, "127.0.0.1:9998")
	ServeDNS(t, w.Inet, Upstream, Zone)
	return w
}
