package sandbox

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
)

// portDialTimeout bounds a connection to a port in a guest; a closed port
// is refused at once.
const portDialTimeout = 10 * time.Second

// DialPort connects to TCP port inside sandbox id's guest, from the
// sandbox's namespace (the daemon's side of its tap): no route, rule or
// address on the host is involved, and the guest's egress policy does not
// apply. It counts as activity for the idle timeout.
func (e *Engine) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: want 1-65535: %w", port, errdefs.ErrInvalidArgument)
	}
	s, err := e.Get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	st, ns := s.state, s.netns
	s.mu.Unlock()
	if st != apiv1.StateRunning || ns == "" {
		return nil, fmt.Errorf("sandbox %s is %s: only a running sandbox's ports can be reached: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	s.touch()
	addr := net.JoinHostPort(s.GuestIP, strconv.Itoa(port))
	if s.GuestIP == "" {
		addr = net.JoinHostPort(netns.GuestAddr, strconv.Itoa(port))
	}
	var conn net.Conn
	d := net.Dialer{Timeout: portDialTimeout}
	// The socket is made on a thread inside the namespace; the connect
	// itself may then wait on any thread.
	if err := netns.DoPath(netns.MountDir+"/"+ns, func() (err error) {
		conn, err = d.DialContext(ctx, "tcp4", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("sandbox %s port %d: %w (is a server listening on 0.0.0.0:%d in the sandbox?): %w", id, port, err, port, errdefs.ErrUnavailable)
	}
	return conn, nil
}
