package egress

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestCompile(t *testing.T) {
	c, err := Policy{Mode: ModeAllow, Allow: []string{
		"198.51.100.0/24", "203.0.113.7", "203.0.113.8:443", "203.0.113.9:8000-8099/tcp", "203.0.113.10/udp",
		"Example.COM.", "*.pypi.org",
	}}.Compile(Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []NetRule{
		{Prefix: netip.MustParsePrefix("198.51.100.0/24")},
		{Prefix: netip.MustParsePrefix("203.0.113.7/32")},
		{Prefix: netip.MustParsePrefix("203.0.113.8/32"), PortLo: 443, PortHi: 443},
		{Prefix: netip.MustParsePrefix("203.0.113.9/32"), Proto: "tcp", PortLo: 8000, PortHi: 8099},
		{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Proto: "udp"},
	}
	if len(c.Nets) != len(want) {
		t.Fatalf("nets = %+v", c.Nets)
	}
	for i := range want {
		if c.Nets[i] != want[i] {
			t.Errorf("net %d = %+v, want %+v", i, c.Nets[i], want[i])
		}
	}
	for q, ok := range map[string]bool{
		"example.com": true, "EXAMPLE.com.": true, "www.example.com": false,
		"files.pypi.org.": true, "a.b.pypi.org": true, "pypi.org": false, "evilpypi.org": false,
	} {
		if c.AllowsName(q) != ok {
			t.Errorf("AllowsName(%q) = %v", q, !ok)
		}
	}
	pub, _ := Policy{Mode: ModePublic}.Compile(Options{})
	none, _ := Policy{Mode: ModeNone}.Compile(Options{})
	if !pub.AllowsName("anything.test") || none.AllowsName("example.com") {
		t.Error("public resolves everything, none nothing")
	}
}

func TestCompileRejects(t *testing.T) {
	for _, c := range []struct {
		p    Policy
		want string
	}{
		{Policy{Mode: "open"}, `mode "open"`},
		{Policy{}, `mode ""`},
		{Policy{Mode: ModePublic, Allow: []string{"example.com"}}, "takes no allow-list"},
		{Policy{Mode: ModeAllow, Allow: []string{"198.51.100.1/24"}}, "host bits"},
		{Policy{Mode: ModeAllow, Allow: []string{"198.51.100.300"}}, "not an IPv4"},
		{Policy{Mode: ModeAllow, Allow: []string{"2001:db8::/32"}}, "not an IPv4"},
		{Policy{Mode: ModeAllow, Allow: []string{"203.0.113.1:0"}}, "want 1-65535"},
		{Policy{Mode: ModeAllow, Allow: []string{"203.0.113.1:90-80"}}, "above the last"},
		{Policy{Mode: ModeAllow, Allow: []string{"10.1.2.3"}}, "reserved range 10.0.0.0/8"},
		{Policy{Mode: ModeAllow, Allow: []string{"169.254.169.254:80"}}, "--network-allow-reserved"},
		{Policy{Mode: ModeAllow, Allow: []string{"0.0.0.0/0"}}, "reserved range"},
		{Policy{Mode: ModeAllow, Allow: []string{"com"}}, "single label"},
		{Policy{Mode: ModeAllow, Allow: []string{"*"}}, "not a domain"},
		{Policy{Mode: ModeAllow, Allow: []string{"a.*.example.com"}}, "wildcard is allowed only"},
		{Policy{Mode: ModeAllow, Allow: []string{"exa mple.com"}}, "not allowed"},
		{Policy{Mode: ModeAllow, Allow: []string{"-x.example.com"}}, "inner hyphens"},
		{Policy{Mode: ModeAllow, Allow: []string{""}}, "empty allow entry"},
		{Policy{Mode: ModeAllow, Allow: make([]string, MaxAllowEntries+1)}, "at most"},
	} {
		_, err := c.p.Compile(Options{})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%+v) = %v; want an invalid argument naming %q", c.p, err, c.want)
		}
	}
	// An administrator may open reserved ranges.
	if _, err := (Policy{Mode: ModeAllow, Allow: []string{"10.1.2.0/24"}}).Compile(Options{AllowReserved: true}); err != nil {
		t.Errorf("reserved range with AllowReserved: %v", err)
	}
}

func TestParseSpec(t *testing.T) {
	for in, want := range map[string]string{
		"none": "none", "public": "public", " public ": "public",
		"allow:198.51.100.0/24, example.com,,": "allow:198.51.100.0/24,example.com",
	} {
		p, err := ParseSpec(in)
		if err != nil || p.String() != want {
			t.Errorf("ParseSpec(%q) = %q, %v; want %q", in, p.String(), err, want)
		}
	}
	for _, bad := range []string{"", "all", "allow", "deny:x"} {
		if _, err := ParseSpec(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseSpec(%q) = %v", bad, err)
		}
	}
}

func TestPool(t *testing.T) {
	p, err := NewPool("10.231.0.0/29") // two links
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Allocate()
	if err != nil || a.Host.String() != "10.231.0.1" || a.NS.String() != "10.231.0.2" || a.Prefix().String() != "10.231.0.0/30" {
		t.Fatalf("first link %+v %v", a, err)
	}
	b, err := p.Allocate()
	if err != nil || b.Host.String() != "10.231.0.5" || b.NS.String() != "10.231.0.6" {
		t.Fatalf("second link %+v %v", b, err)
	}
	if _, err := p.Allocate(); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "--network-pool") {
		t.Errorf("exhausted pool: %v", err)
	}
	p.Release(a)
	p.Release(a) // twice is harmless
	if p.InUse() != 1 {
		t.Errorf("in use %d", p.InUse())
	}
	if c, err := p.Allocate(); err != nil || c.Host != a.Host {
		t.Errorf("reallocated %+v %v", c, err)
	}
	// Links found at start are claimed by either address.
	q, _ := NewPool("10.231.0.0/16")
	if l, ok := q.Claim(netip.MustParseAddr("10.231.3.6")); !ok || l.Host.String() != "10.231.3.5" || q.InUse() != 1 {
		t.Errorf("claim %+v %v", l, ok)
	}
	if _, ok := q.Claim(netip.MustParseAddr("10.232.0.1")); ok {
		t.Error("address outside the pool claimed")
	}
	if q.Size() != 16384 {
		t.Errorf("a /16 holds %d links", q.Size())
	}
	for _, bad := range []string{"10.231.0.0/30", "10.0.0.0/7", "10.231.0.1/16", "2001:db8::/64", "x"} {
		if _, err := NewPool(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("NewPool(%q) = %v", bad, err)
		}
	}
}

func TestHostLinkName(t *testing.T) {
	if n := HostLinkName("sb-0123456789"); n != "fkv0123456789" {
		t.Errorf("HostLinkName = %q", n)
	}
	if n := HostLinkName("a-very-long-sandbox-id"); len(n) != 15 {
		t.Errorf("long id's link name %q", n)
	}
}
