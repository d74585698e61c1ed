package egress

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// DefaultPool is the address pool of sandbox uplinks when the config names
// none: 16,384 /30 links.
const DefaultPool = "10.231.0.0/16"

// Link is one sandbox's uplink: a /30 whose first host address is the
// host's side and the second the namespace's.
type Link struct {
	Index int
	Host  netip.Addr
	NS    netip.Addr
}

// Prefix is the link's /30.
func (l Link) Prefix() netip.Prefix { return netip.PrefixFrom(l.Host.Prev(), 30) }

// Pool hands out /30 uplinks from a network. Safe for concurrent use.
type Pool struct {
	net netip.Prefix

	mu   sync.Mutex
	used []bool
	next int
	free int
}

// NewPool makes a pool of the /30s of cidr (an IPv4 network of /8 to /29).
func NewPool(cidr string) (*Pool, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 29 || p != p.Masked() {
		return nil, fmt.Errorf("network pool %q: want an IPv4 network from /8 to /29 without host bits, e.g. %s: %w", cidr, DefaultPool, errdefs.ErrInvalidArgument)
	}
	n := 1 << (30 - p.Bits())
	return &Pool{net: p, used: make([]bool, n), free: n}, nil
}

// Network is the pool's network.
func (p *Pool) Network() netip.Prefix { return p.net }

// Size is the number of links the pool holds.
func (p *Pool) Size() int { return len(p.used) }

// Allocate takes a free link. An exhausted pool is errdefs.ErrUnavailable
// (a 503) saying so.
func (p *Pool) Allocate() (Link, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == 0 {
		return Link{}, fmt.Errorf("network pool %s: all %d sandbox links are in use; end sandboxes or configure a larger --network-pool (config network_pool): %w", p.net, len(p.used), errdefs.ErrUnavailable)
	}
	for i := 0; i < len(p.used); i++ {
		j := (p.next + i) % len(p.used)
		if !p.used[j] {
			p.used[j], p.next = true, j+1
			p.free--
			return p.link(j), nil
		}
	}
	panic("egress: pool free count out of step")
}

// Claim marks the link holding addr (either side) as used, for links found
// at start that a running sandbox still holds. It reports false for an
// address outside the pool.
func (p *Pool) Claim(addr netip.Addr) (Link, bool) {
	i, ok := p.index(addr)
	if !ok {
		return Link{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.used[i] {
		p.used[i] = true
		p.free--
	}
	return p.link(i), true
}

// Release returns a link to the pool; releasing a free one does nothing.
func (p *Pool) Release(l Link) {
	i, ok := p.index(l.Host)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used[i] {
		p.used[i] = false
		p.free++
	}
}

// InUse is the number of links taken.
func (p *Pool) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.used) - p.free
}

func (p *Pool) index(a netip.Addr) (int, bool) {
	if !p.net.Contains(a) {
		return 0, false
	}
	off := be32(a) - be32(p.net.Addr())
	return int(off / 4), true
}

func (p *Pool) link(i int) Link {
	base := be32(p.net.Addr()) + uint32(i)*4
	return Link{Index: i, Host: addr32(base + 1), NS: addr32(base + 2)}
}

func be32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addr32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
