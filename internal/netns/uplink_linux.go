package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// UplinkName is the namespace's side of its uplink veth.
const UplinkName = "up0"

// ip6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE: no IPv6 link-local
// address, so no addrconf on the link.
const ip6AddrGenModeNone = 1

// Uplink is a veth pair from the host into a sandbox namespace: HostName
// (in the host namespace) carries HostAddr, UplinkName in the sandbox's
// NSAddr, and the sandbox's default route points at HostAddr.
type Uplink struct {
	HostName string
	HostAddr netip.Prefix
	NSAddr   netip.Prefix
}

// RouteHandle is a route netlink handle in a namespace: the process's own
// when path is "", else the namespace bind-mounted at path. (A handle
// opens a socket per family it is given, all three by default, each by a
// switch into the namespace and back.)
func RouteHandle(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	h, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", path, err)
	}
	defer h.Close()
	return netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
}

// AddUplink creates u between the host namespace (hostNS; "" for the
// process's own) and ns, brings both ends up and routes the namespace's
// traffic to the host. On error nothing of it is left.
func (ns *NS) AddUplink(hostNS string, u Uplink) (err error) {
	if len(u.HostName) >= unix.IFNAMSIZ || u.HostName == "" {
		return fmt.Errorf("netns %s: uplink name %q: want 1-15 bytes", ns.name, u.HostName)
	}
	host, err := RouteHandle(hostNS)
	if err != nil {
		return fmt.Errorf("netns %s: uplink: %w", ns.name, err)
	}
	defer host.Close()
	target, err := vnetns.GetFromPath(ns.Path())
	if err != nil {
		return fmt.Errorf("netns %s: %w", ns.name, err)
	}
	defer target.Close()
	inner, err := netlink.NewHandleAt(target, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netns %s: %w", ns.name, err)
	}
	defer inner.Close()

	// The inner end is made in the namespace, where IPv6 is off
	// (disableIPv6); the host end gets no IPv6 address either, so
	// addrconf never starts on it: it is brought up after that is set.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: u.HostName},
		PeerName:      UplinkName,
		PeerNamespace: netlink.NsFd(int(target)),
	}
	if err := host.LinkAdd(veth); err != nil {
		return fmt.Errorf("netns %s: create uplink %s: %w", ns.name, u.HostName, err)
	}
	defer func() {
		if err != nil {
			host.LinkDel(veth)
		}
	}()
	if err := host.LinkSetIP6AddrGenMode(veth, ip6AddrGenModeNone); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("netns %s: uplink %s: no IPv6 address: %w", ns.name, u.HostName, err)
	}
	if err := host.LinkSetUp(veth); err != nil {
		return fmt.Errorf("netns %s: uplink %s up: %w", ns.name, u.HostName, err)
	}
	// LinkAdd filled in the host side's index.
	if err := host.AddrAdd(veth, &netlink.Addr{IPNet: ipnet(u.HostAddr)}); err != nil {
		return fmt.Errorf("netns %s: uplink %s address: %w", ns.name, u.HostName, err)
	}
	nl, err := inner.LinkByName(UplinkName)
	if err != nil {
		return fmt.Errorf("netns %s: %s: %w", ns.name, UplinkName, err)
	}
	if err := inner.AddrAdd(nl, &netlink.Addr{IPNet: ipnet(u.NSAddr)}); err != nil {
		return fmt.Errorf("netns %s: %s address: %w", ns.name, UplinkName, err)
	}
	if err := inner.LinkSetUp(nl); err != nil {
		return fmt.Errorf("netns %s: %s up: %w", ns.name, UplinkName, err)
	}
	gw := u.HostAddr.Addr().As4()
	if err := inner.RouteAdd(&netlink.Route{LinkIndex: nl.Attrs().Index, Gw: net.IP(gw[:])}); err != nil {
		return fmt.Errorf("netns %s: default route: %w", ns.name, err)
	}
	return nil
}

func ipnet(p netip.Prefix) *net.IPNet {
	a := p.Addr().As4()
	return &net.IPNet{IP: net.IP(a[:]), Mask: net.CIDRMask(p.Bits(), 32)}
}

// RemoveUplink deletes the host side of an uplink (and so its peer);
// one that is gone already is no error.
func RemoveUplink(hostNS, hostName string) error {
	host, err := RouteHandle(hostNS)
	if err != nil {
		return err
	}
	defer host.Close()
	l, err := host.LinkByName(hostName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("uplink %s: %w", hostName, err)
	}
	if err := host.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete uplink %s: %w", hostName, err)
	}
	return nil
}

// HostUplinks returns the host-side uplinks whose names start with
// prefix, with their first IPv4 address (invalid if none), so a restarted
// daemon can claim the addresses of the sandboxes it adopts and remove the
// rest.
func HostUplinks(hostNS, prefix string) (map[string]netip.Addr, error) {
	host, err := RouteHandle(hostNS)
	if err != nil {
		return nil, err
	}
	defer host.Close()
	links, err := host.LinkList()
	if err != nil {
		return nil, err
	}
	out := map[string]netip.Addr{}
	for _, l := range links {
		name := l.Attrs().Name
		if !strings.HasPrefix(name, prefix) || l.Type() != "veth" {
			continue
		}
		var a netip.Addr
		if addrs, err := host.AddrList(l, unix.AF_INET); err == nil && len(addrs) > 0 {
			a, _ = netip.AddrFromSlice(addrs[0].IP.To4())
		}
		out[name] = a
	}
	return out, nil
}

// SetForwarding turns IPv4 forwarding on in the namespace at path ("" for
// the process's own): the sandbox's namespace routes its guest, the host's
// its sandboxes.
func SetForwarding(path string) error {
	write := func() error {
		const f = "/proc/sys/net/ipv4/ip_forward"
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "1" {
			return nil
		}
		if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("enable IPv4 forwarding: %w", err)
		}
		return nil
	}
	if path == "" {
		return write()
	}
	return DoPath(path, write)
}
