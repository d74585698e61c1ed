// Package egress decides and enforces what a sandbox may reach on the
// network: its policy (none, public, or an allow-list of networks and
// domain names), the address pool its uplink is numbered from, the
// nftables rules in its namespace and in the host's, and the resolver that
// answers its DNS and opens the addresses of allowed names.
//
// Every sandbox namespace looks alike inside: the guest is
// netns.GuestAddr behind the tap; an uplink veth (UplinkName) carries a
// /30 of the pool to the host, whose side is named HostLinkPrefix + the
// sandbox's id. Rules live in the namespace (table "forkd": forward
// filter, NAT to the uplink, DNS redirect) and in the host (one table per
// engine: masquerade the pool toward the host's own routes, drop what
// sandboxes send to the host itself or to each other).
package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Mode is a policy's kind.
type Mode string

const (
	// ModeNone: no route out (the guest reaches nothing but its resolver,
	// which refuses every name).
	ModeNone Mode = "none"
	// ModePublic: the internet, but never the host, other sandboxes or
	// the ranges in Reserved.
	ModePublic Mode = "public"
	// ModeAllow: only the networks and names of the allow-list.
	ModeAllow Mode = "allow"
)

// Limits on a policy, stated in the errors that enforce them.
const (
	MaxAllowEntries = 256
	maxDomainLen    = 253
	maxConnections  = 1 << 20
	maxRateMbit     = 100_000
)

// Policy is what a sandbox may reach. The zero Policy is unset (inherit).
type Policy struct {
	Mode Mode `json:"mode"`
	// Allow lists, for ModeAllow, what the sandbox may reach: networks
	// ("198.51.100.0/24", "203.0.113.7"), optionally with a port or port
	// range and a protocol ("203.0.113.7:443", "198.51.100.0/24:8000-8099/tcp",
	// "203.0.113.9/udp"), and domain names ("example.com", or
	// "*.example.com" for every name below it).
	Allow []string `json:"allow,omitempty"`
	// MaxConnections caps the connections the guest has open through its
	// uplink at once (0: no cap); one more is refused.
	MaxConnections int `json:"max_connections,omitempty"`
	// RateMbit caps the guest's traffic through its uplink, each way, in
	// megabits per second (0: no cap); what is over is dropped, which TCP
	// reads as congestion.
	RateMbit int `json:"rate_mbit,omitempty"`
}

// IsZero reports an unset policy.
func (p Policy) IsZero() bool {
	return p.Mode == "" && len(p.Allow) == 0 && p.MaxConnections == 0 && p.RateMbit == 0
}

// String is the policy as the CLI takes it: "none", "public", or
// "allow:ENTRY,ENTRY".
func (p Policy) String() string {
	s := string(p.Mode)
	if p.Mode == ModeAllow {
		s = "allow:" + strings.Join(p.Allow, ",")
	}
	if p.MaxConnections > 0 {
		s += fmt.Sprintf(" (at most %d connections)", p.MaxConnections)
	}
	if p.RateMbit > 0 {
		s += fmt.Sprintf(" (%d Mbit/s each way)", p.RateMbit)
	}
	return s
}

// ParseSpec reads a policy as the CLI and the config take it: "none",
// "public", or "allow:ENTRY[,ENTRY...]".
func ParseSpec(s string) (Policy, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == string(ModeNone), s == string(ModePublic):
		return Policy{Mode: Mode(s)}, nil
	case strings.HasPrefix(s, "allow:"):
		var allow []string
		for _, e := range strings.Split(strings.TrimPrefix(s, "allow:"), ",") {
			if e = strings.TrimSpace(e); e != "" {
				allow = append(allow, e)
			}
		}
		return Policy{Mode: ModeAllow, Allow: allow}, nil
	}
	return Policy{}, fmt.Errorf("network policy %q: want none, public or allow:ENTRY,ENTRY (a CIDR, ADDR[:PORT[-PORT]][/tcp|/udp], or a domain such as *.example.com): %w", s, errdefs.ErrInvalidArgument)
}

// NetRule allows a network, optionally only some ports of one protocol.
type NetRule struct {
	Prefix netip.Prefix
	Proto  string // "tcp", "udp", or "" for any
	// PortLo..PortHi is the port range; both 0 for every port.
	PortLo, PortHi uint16
}

// DomainRule allows a name (Wildcard: every name below it, not the name
// itself).
type DomainRule struct {
	Name     string // lower case, no trailing dot
	Wildcard bool
}

// Matches reports whether the query name q (any case, trailing dot or not)
// is allowed by r.
func (r DomainRule) Matches(q string) bool {
	q = strings.ToLower(strings.TrimSuffix(q, "."))
	if r.Wildcard {
		return strings.HasSuffix(q, "."+r.Name)
	}
	return q == r.Name
}

// Compiled is a validated policy in the form rules are built from.
type Compiled struct {
	Mode           Mode
	Nets           []NetRule
	Domains        []DomainRule
	MaxConnections int
	RateMbit       int
}

// AllowsName reports whether a DNS name may be resolved.
func (c *Compiled) AllowsName(q string) bool {
	switch c.Mode {
	case ModePublic:
		return true
	case ModeAllow:
		return slices.ContainsFunc(c.Domains, func(d DomainRule) bool { return d.Matches(q) })
	}
	return false
}

// Options are the daemon's settings that bound policies.
type Options struct {
	// AllowReserved lets an allow-list open ranges in Reserved (private,
	// CGNAT, link-local, loopback, multicast): an administrator's setting
	// (--network-allow-reserved, config network_allow_reserved), never a request's.
	AllowReserved bool
}

// Reserved are the ranges no sandbox reaches under ModePublic, nor under
// ModeAllow unless Options.AllowReserved: this network, private and CGNAT
// ranges (other sandboxes' uplinks, the host's and its LAN's services),
// loopback, link-local (cloud metadata at 169.254.169.254), the IETF
// protocol block, multicast and the reserved block up to broadcast.
var Reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Compile validates p and returns it in rule form. An unset mode is
// invalid (resolve inheritance first); errors are errdefs.ErrInvalidArgument
// naming the entry and what to write instead.
func (p Policy) Compile(o Options) (*Compiled, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("network policy: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	c := &Compiled{Mode: p.Mode, MaxConnections: p.MaxConnections, RateMbit: p.RateMbit}
	if p.MaxConnections < 0 || p.MaxConnections > maxConnections {
		return nil, bad("max_connections %d: want 0 (no cap) to %d", p.MaxConnections, maxConnections)
	}
	if p.RateMbit < 0 || p.RateMbit > maxRateMbit {
		return nil, bad("rate_mbit %d: want 0 (no cap) to %d", p.RateMbit, maxRateMbit)
	}
	switch p.Mode {
	case ModeNone, ModePublic:
		if len(p.Allow) > 0 {
			return nil, bad("mode %q takes no allow-list (use mode \"allow\")", p.Mode)
		}
		return c, nil
	case ModeAllow:
	default:
		return nil, bad("mode %q: want none, public or allow", p.Mode)
	}
	if len(p.Allow) > MaxAllowEntries {
		return nil, bad("%d allow entries, at most %d", len(p.Allow), MaxAllowEntries)
	}
	for _, e := range p.Allow {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, bad("an empty allow entry")
		}
		if looksLikeAddress(e) {
			r, err := parseNetRule(e)
			if err != nil {
				return nil, bad("allow entry %q: %v", e, err)
			}
			if !o.AllowReserved {
				if i := slices.IndexFunc(Reserved, r.Prefix.Overlaps); i >= 0 {
					return nil, bad("allow entry %q opens the reserved range %s (private, loopback, link-local or multicast: the host's and other sandboxes' addresses); only the daemon's --network-allow-reserved (config network_allow_reserved = true) permits that", e, Reserved[i])
				}
			}
			c.Nets = append(c.Nets, r)
			continue
		}
		d, err := parseDomain(e)
		if err != nil {
			return nil, bad("allow entry %q: %v", e, err)
		}
		c.Domains = append(c.Domains, d)
	}
	return c, nil
}

// looksLikeAddress: entries that start with a digit are networks (no
// top-level domain is numeric), and so are IPv6 ones.
func looksLikeAddress(e string) bool { return e[0] >= '0' && e[0] <= '9' || strings.Contains(e, "::") }

// parseNetRule reads ADDR[/LEN][:PORT[-PORT]][/tcp|/udp].
func parseNetRule(e string) (NetRule, error) {
	var r NetRule
	if strings.Count(e, ":") > 1 {
		return r, fmt.Errorf("not an IPv4 address or CIDR: only IPv4 is routed to sandboxes")
	}
	if i := strings.LastIndexByte(e, '/'); i >= 0 && (e[i+1:] == "tcp" || e[i+1:] == "udp") {
		r.Proto, e = e[i+1:], e[:i]
	}
	if i := strings.IndexByte(e, ':'); i >= 0 {
		lo, hi, err := parsePorts(e[i+1:])
		if err != nil {
			return r, err
		}
		r.PortLo, r.PortHi, e = lo, hi, e[:i]
	}
	var err error
	if strings.Contains(e, "/") {
		r.Prefix, err = netip.ParsePrefix(e)
		if err == nil && r.Prefix != r.Prefix.Masked() {
			return r, fmt.Errorf("%s has host bits set (the network is %s)", r.Prefix, r.Prefix.Masked())
		}
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(e); err == nil {
			r.Prefix = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return r, fmt.Errorf("not an IPv4 address or CIDR (e.g. 198.51.100.0/24)")
	}
	if !r.Prefix.Addr().Is4() {
		return r, fmt.Errorf("only IPv4 is routed to sandboxes")
	}
	return r, nil
}

func parsePorts(s string) (lo, hi uint16, err error) {
	a, b, isRange := strings.Cut(s, "-")
	p := func(s string) (uint16, error) {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return 0, fmt.Errorf("port %q: want 1-65535", s)
		}
		return uint16(n), nil
	}
	if lo, err = p(a); err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = p(b); err != nil {
			return 0, 0, err
		}
		if hi < lo {
			return 0, 0, fmt.Errorf("port range %s: the first port is above the last", s)
		}
	}
	return lo, hi, nil
}

// parseDomain reads NAME or *.NAME (RFC 1123 labels; lower-cased).
func parseDomain(e string) (DomainRule, error) {
	var d DomainRule
	name := strings.ToLower(strings.TrimSuffix(e, "."))
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		d.Wildcard, name = true, rest
	}
	if name == "" || len(name) > maxDomainLen {
		return d, fmt.Errorf("not a domain name (want example.com or *.example.com)")
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 && (d.Wildcard || name == "*") {
		return d, fmt.Errorf("not a domain name (want example.com or *.example.com)")
	}
	if len(labels) < 2 {
		return d, fmt.Errorf("a single label opens a whole top-level domain; name a domain such as example.com")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return d, fmt.Errorf("label %q: want 1-63 letters, digits or inner hyphens (a wildcard is allowed only as the first label, *.example.com)", l)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return d, fmt.Errorf("label %q: character %q not allowed (a wildcard is allowed only as the first label, *.example.com)", l, r)
			}
		}
	}
	d.Name = name
	return d, nil
}
