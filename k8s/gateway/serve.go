package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server serves a Gateway on Addr: a manager.Runnable that runs on every
// replica, elected or not (NeedLeaderElection), so the Service in front
// of the controller's replicas reaches a gateway on each; it reads
// Sandboxes from the replica's cache, creates them for the elected
// replica to place and fork, and finds the daemons through an
// AddressBook. Off loopback it needs CertFile and KeyFile: tokens travel
// in it.
type Server struct {
	Gateway           *Gateway
	Addr              string
	CertFile, KeyFile string
}

// NeedLeaderElection says the gateway serves on every replica.
func (s *Server) NeedLeaderElection() bool { return false }

// Start listens and serves until ctx ends, then shuts down gracefully
// (open streams get 30 s).
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	tlsOn := s.CertFile != "" || s.KeyFile != ""
	if !tlsOn && !isLoopback(ln.Addr()) {
		ln.Close()
		return fmt.Errorf("gateway: %s is not a loopback address and no --gateway-tls-cert/--gateway-tls-key were given: bearer tokens would travel in clear", s.Addr)
	}
	srv := &http.Server{
		Handler:           s.Gateway.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12},
	}
	done := make(chan error, 1)
	go func() {
		if tlsOn {
			done <- srv.ServeTLS(ln, s.CertFile, s.KeyFile)
		} else {
			done <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-done:
		return fmt.Errorf("gateway: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if e := <-done; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

func isLoopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}
