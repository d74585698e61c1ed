package auth

import (
	"crypto/tls"
	"fmt"
	"net"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// ListenConfig says where and how the daemon listens on TCP. Tokens are
// required on every TCP connection whatever these say (Middleware).
type ListenConfig struct {
	// Addr is host:port, e.g. "127.0.0.1:7777" or ":7777" (every interface).
	Addr string
	// CertFile and KeyFile are a PEM certificate (chain) and its key; both
	// or neither. With them the listener speaks TLS 1.2 or newer.
	CertFile, KeyFile string
	// Insecure allows a non-loopback address without TLS, sending tokens in
	// the clear (forkd serve --insecure-no-tls-or-auth-i-know). It never
	// turns tokens off.
	Insecure bool
}

// TLS reports whether cfg asks for TLS.
func (cfg ListenConfig) TLS() bool { return cfg.CertFile != "" || cfg.KeyFile != "" }

// Listen opens the TCP listener of cfg, wrapped in TLS when cfg has a
// certificate. It refuses, with an invalid-argument error naming the fix, a
// non-loopback address without TLS unless cfg.Insecure. Whether the address
// is loopback is decided on the address actually bound (so "localhost" and
// ":0" are judged by what they resolve to).
func Listen(cfg ListenConfig) (net.Listener, error) {
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, fmt.Errorf("listen %s: TLS needs both a certificate and a key (--tls-cert and --tls-key): %w", cfg.Addr, errdefs.ErrInvalidArgument)
	}
	var tcfg *tls.Config
	if cfg.TLS() {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("listen %s: TLS certificate %s / key %s: %v: %w", cfg.Addr, cfg.CertFile, cfg.KeyFile, err, errdefs.ErrInvalidArgument)
		}
		tcfg = &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			NextProtos:   []string{"h2", "http/1.1"},
		}
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen %q: want host:port, e.g. 127.0.0.1:7777: %w", cfg.Addr, errdefs.ErrInvalidArgument)
	}
	// Refuse before binding when the address says it all.
	if ip := net.ParseIP(host); (host == "" || ip != nil) && !loopback(ip) {
		if err := checkExposure(cfg); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); !ok || !loopback(ta.IP) {
		if err := checkExposure(cfg); err != nil {
			ln.Close()
			return nil, err
		}
	}
	if tcfg != nil {
		ln = tls.NewListener(ln, tcfg)
	}
	return ln, nil
}

func loopback(ip net.IP) bool { return ip != nil && ip.IsLoopback() }

// checkExposure is the rule for a non-loopback address.
func checkExposure(cfg ListenConfig) error {
	if cfg.TLS() || cfg.Insecure {
		return nil
	}
	return fmt.Errorf("listen %s: refusing a non-loopback address without TLS, which would send bearer tokens in the clear; "+
		"give a certificate with --tls-cert and --tls-key, bind 127.0.0.1 instead, "+
		"or pass --insecure-no-tls-or-auth-i-know if the network is trusted (tokens stay required): %w", cfg.Addr, errdefs.ErrInvalidArgument)
}
