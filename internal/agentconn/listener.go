package agentconn

import (
	"context"
	"errors"
	"net"
	"sync"
)

// ServeListener serves the transport on connections accepted from ln (the
// guest's vsock listener under Firecracker, whose host end connects with
// "CONNECT <port>"), one at a time: each is a port of its own (Server.
// Connection), with its own HELLO. A new connection supersedes the one
// being served, which is closed: the host makes one at a time, and one it
// made before a snapshot was restored is dead even if no reset reached
// the guest. It returns when ctx is done or ln fails (ln closed).
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	s.Connection = true
	conns := make(chan net.Conn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			select {
			case conns <- c:
			case <-ctx.Done():
				c.Close()
				return
			}
		}
	}()
	var (
		cur  net.Conn
		wg   sync.WaitGroup
		stop = func() {
			if cur != nil {
				cur.Close()
				wg.Wait()
				cur = nil
			}
		}
	)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-acceptErr:
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		case c := <-conns:
			stop()
			cur = c
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.Serve(ctx, c)
				c.Close()
				s.logf("host connection ended: %v", err)
			}()
		}
	}
}
