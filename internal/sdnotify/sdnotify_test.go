package sdnotify

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listen opens a real unixgram socket, as systemd does for a notify
// service, and returns its address and a function reading one datagram.
func listen(t *testing.T, addr string) func() string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func() string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4096)
		n, _, err := conn.ReadFromUnix(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
}

func TestNotifyPath(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "notify.sock")
	recv := listen(t, addr)
	t.Setenv(SocketEnv, addr)
	sent, err := Notify(Ready, Status("serving on /run/forkd/forkd.sock\nsecond line"))
	if err != nil || !sent {
		t.Fatalf("Notify: sent %v, err %v", sent, err)
	}
	if got, want := recv(), "READY=1\nSTATUS=serving on /run/forkd/forkd.sock second line"; got != want {
		t.Fatalf("datagram %q, want %q", got, want)
	}
	if _, err := Notify(Stopping); err != nil {
		t.Fatal(err)
	}
	if got := recv(); got != Stopping {
		t.Fatalf("datagram %q, want %q", got, Stopping)
	}
}

func TestNotifyAbstract(t *testing.T) {
	addr := "@forkd-sdnotify-test-" + strings.ReplaceAll(t.Name(), "/", "-") + time.Now().Format("150405.000000000")
	recv := listen(t, addr)
	t.Setenv(SocketEnv, addr)
	if _, err := Notify(Ready); err != nil {
		t.Fatal(err)
	}
	if got := recv(); got != Ready {
		t.Fatalf("datagram %q, want %q", got, Ready)
	}
}

func TestNotifyUnset(t *testing.T) {
	t.Setenv(SocketEnv, "")
	sent, err := Notify(Ready)
	if sent || err != nil {
		t.Fatalf("without %s: sent %v, err %v; want a no-op", SocketEnv, sent, err)
	}
}

func TestNotifyErrors(t *testing.T) {
	for _, addr := range []string{"relative/notify.sock", "vsock:2:1234", filepath.Join(t.TempDir(), "nobody-listens")} {
		t.Setenv(SocketEnv, addr)
		if sent, err := Notify(Ready); !sent || err == nil {
			t.Errorf("%s=%q: sent %v, err %v; want an error", SocketEnv, addr, sent, err)
		}
	}
}
