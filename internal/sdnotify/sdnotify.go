// Package sdnotify tells a service manager about the daemon's state with
// the sd_notify protocol: one datagram per state change ("READY=1",
// "STOPPING=1", "STATUS=...") to the unix datagram socket named by
// $NOTIFY_SOCKET. systemd sets that variable for a Type=notify service;
// without it every call is a no-op, so the daemon calls Notify the same
// way whether or not a service manager started it.
//
// Only what forkd needs is implemented: no file-descriptor passing, no
// watchdog, no vsock addresses.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// SocketEnv names the socket to notify.
const SocketEnv = "NOTIFY_SOCKET"

// States the daemon sends.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Status is a STATUS= line: free text that `systemctl status` shows.
func Status(text string) string {
	return "STATUS=" + strings.ReplaceAll(text, "\n", " ")
}

// sendTimeout bounds a send to a manager that stopped reading: the daemon
// must not hang on its readiness message.
const sendTimeout = 5 * time.Second

// Notify sends states (joined by newlines, one datagram) to
// $NOTIFY_SOCKET. It reports whether a socket was named: false with a nil
// error when the daemon does not run under a notifying service manager.
// A socket name starting with @ is in the abstract namespace.
func Notify(states ...string) (bool, error) {
	addr := os.Getenv(SocketEnv)
	if addr == "" {
		return false, nil
	}
	return true, send(addr, strings.Join(states, "\n"))
}

func send(addr, msg string) error {
	if !strings.HasPrefix(addr, "/") && !strings.HasPrefix(addr, "@") {
		return fmt.Errorf("%s=%q: want an absolute path or an @abstract name (vsock addresses are not supported): %w",
			SocketEnv, addr, errdefs.ErrInvalidArgument)
	}
	ua := &net.UnixAddr{Name: addr, Net: "unixgram"}
	if addr[0] == '@' {
		// Go spells the abstract namespace's leading NUL as @ too.
		ua.Name = "@" + addr[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, ua)
	if err != nil {
		return fmt.Errorf("notify the service manager at %s: %w", addr, err)
	}
	defer conn.Close()
	conn.SetWriteDeadline(time.Now().Add(sendTimeout))
	n, err := conn.Write([]byte(msg))
	if err == nil && n != len(msg) {
		err = errors.New("short write")
	}
	if err != nil {
		return fmt.Errorf("notify the service manager at %s: %w", addr, err)
	}
	return nil
}
