package oci

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Timeouts of a registry connection: a registry that does not answer
// cannot hold a pull (and its build slot) forever.
const (
	dialTimeout           = 30 * time.Second
	tlsTimeout            = 30 * time.Second
	responseHeaderTimeout = time.Minute
)

// sharedRanges are addresses that are not public although net.IP's
// predicates do not say so: carrier-grade NAT and benchmarking nets.
var sharedRanges = []netip.Prefix{
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("198.18.0.0/15"),
}

// privateAddrError is a connection refused because its address is not a
// public one (Auth.PublicOnly).
type privateAddrError struct{ addr string }

func (e *privateAddrError) Error() string {
	return fmt.Sprintf("address %s is not public: a tenant's pull reaches public registries only (an operator can allow a private registry with forkd serve --registry-private HOST)", e.addr)
}

func (e *privateAddrError) Unwrap() error { return errdefs.ErrPermissionDenied }

// publicOnly is a dialer Control that refuses loopback, private,
// link-local, multicast, unspecified and shared addresses. Checked at
// dial time, it also covers redirects and names that resolve (or
// rebind) to such an address.
func publicOnly(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &privateAddrError{addr: address}
	}
	ip := ap.Addr().Unmap()
	if !ip.IsGlobalUnicast() || ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
		return &privateAddrError{addr: address}
	}
	for _, p := range sharedRanges {
		if p.Contains(ip) {
			return &privateAddrError{addr: address}
		}
	}
	return nil
}

// httpClient is the HTTP client of a registry connection: bounded dial,
// TLS and response-header waits; with restrict, only public addresses
// and no proxy from the environment (whose address would be dialled
// instead of the registry's).
func httpClient(restrict bool) *http.Client {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   tlsTimeout,
		ResponseHeaderTimeout: responseHeaderTimeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
		ForceAttemptHTTP2:     true,
	}
	if restrict {
		d.Control = publicOnly
		tr.Proxy = nil
	}
	return &http.Client{Transport: tr}
}
