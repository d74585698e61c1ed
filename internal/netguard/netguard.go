// Package netguard keeps connections the daemon makes for a tenant (a
// registry pull, a build's base image) to public addresses: a tenant must
// not make the daemon reach the host's or its network's services.
package netguard

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// sharedRanges are addresses that are not public although netip's
// predicates do not say so: carrier-grade NAT and benchmarking nets.
var sharedRanges = []netip.Prefix{
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("198.18.0.0/15"),
}

// PrivateAddrError is a connection refused because its address is not a
// public one. It is a PermissionDenied error.
type PrivateAddrError struct{ Addr string }

func (e *PrivateAddrError) Error() string {
	return fmt.Sprintf("address %s is not public: a tenant's pull reaches public registries only (an operator can allow a private registry with forkd serve --registry-private HOST)", e.Addr)
}

func (e *PrivateAddrError) Unwrap() error { return errdefs.ErrPermissionDenied }

// PublicOnly is a net.Dialer Control that refuses loopback, private,
// link-local, multicast, unspecified and shared addresses. Checked at
// dial time, it also covers redirects and names that resolve (or
// rebind) to such an address. A dialer using it must not go through a
// proxy from the environment, whose address would be dialled instead.
func PublicOnly(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &PrivateAddrError{Addr: address}
	}
	ip := ap.Addr().Unmap()
	if !ip.IsGlobalUnicast() || ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
		return &PrivateAddrError{Addr: address}
	}
	for _, p := range sharedRanges {
		if p.Contains(ip) {
			return &PrivateAddrError{Addr: address}
		}
	}
	return nil
}
