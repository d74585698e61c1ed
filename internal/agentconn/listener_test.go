package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// ServeListener is the guest side over a listener (vsock under
// Firecracker; a Unix socket here, which has the same stream semantics):
// each connection gets its own HELLO and session; a host that closes its
// connection can connect again; a new connection supersedes one still
// open (the host's before a snapshot was restored), whose session ends.
func TestServeListenerConnections(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+agentapi.PathInfo, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(agentapi.Info{ProtocolVersion: agentapi.Version, SandboxID: id})
	})
	srv := &Server{Handler: mux, Logf: testLogf(t), OnHello: func(h agentapi.Hello) (agentapi.Info, error) {
		id = h.Identity.SandboxID
		return agentapi.Info{ProtocolVersion: agentapi.Version, SandboxID: id}, nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.ServeListener(ctx, ln) }()
	connect := func() net.Conn {
		t.Helper()
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	c1 := connect()
	s1 := dial(t, c1, "sb-one")
	mustInfo(t, s1, "sb-one")
	s1.Close()
	c1.Close()

	s2 := dial(t, connect(), "sb-two") // after the first host went away
	mustInfo(t, s2, "sb-two")
	s3 := dial(t, connect(), "sb-three") // while the second is still open
	mustInfo(t, s3, "sb-three")
	select {
	case <-s2.Done():
	case <-time.After(time.Minute):
		t.Fatal("the superseded connection's session did not end")
	}

	cancel()
	select {
	case err := <-served:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("ServeListener returned %v, want the context's end", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ServeListener did not return when its context ended")
	}
}
