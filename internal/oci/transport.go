package oci

import (
	"net"
	"net/http"
	"time"

	"github.com/forkd-dev/forkd/internal/netguard"
)

// Timeouts of a registry connection: a registry that does not answer
// cannot hold a pull (and its build slot) forever.
const (
	dialTimeout           = 30 * time.Second
	tlsTimeout            = 30 * time.Second
	responseHeaderTimeout = time.Minute
)

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
		d.Control = netguard.PublicOnly
		tr.Proxy = nil
	}
	return &http.Client{Transport: tr}
}
