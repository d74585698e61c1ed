package api

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serveTest serves h with NewHTTPServer on a loopback TCP port and
// returns the server and its address.
func serveTest(t *testing.T, h http.Handler, maxConns int) (*HTTPServer, string) {
	t.Helper()
	s := NewHTTPServer(h, maxConns)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().String()
}

// rawRequest opens a connection of its own and sends req on it.
func rawRequest(t *testing.T, addr, req string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c
}

// status reads the status line of the response on c.
func status(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	return strings.TrimSpace(line)
}

func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// With the cap reached, further connections wait to be accepted; the
// connections being served go on, and the waiting ones are served once
// slots free up.
func TestHTTPServerConnectionCap(t *testing.T) {
	const limit = 3
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	var inflight, most atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if r.URL.Path == "/block" {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	})
	s, addr := serveTest(t, h, limit)
	url := "http://" + addr

	// A keep-alive client takes one slot and keeps it (idle).
	keep := &http.Client{Transport: &http.Transport{}, Timeout: time.Minute}
	get := func() {
		t.Helper()
		resp, err := keep.Get(url + "/ok")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	get()
	// The others are taken by requests that block.
	var blocked []net.Conn
	for range limit - 1 {
		blocked = append(blocked, rawRequest(t, addr, "GET /block HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
		<-arrived
	}
	// Two more connections: the server waits for a slot before it
	// accepts them.
	var extra []net.Conn
	for range 2 {
		extra = append(extra, rawRequest(t, addr, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
	}
	waitUntil(t, func() bool { return s.waiting.Load() == 1 }, "the server to wait for a free connection slot")
	// The connections it serves still get answers.
	get()

	close(release)
	for _, c := range append(blocked, extra...) {
		if got := status(t, c); got != "HTTP/1.1 200 OK" {
			t.Errorf("status %q", got)
		}
	}
	if m := most.Load(); m > limit {
		t.Errorf("%d requests served at once, over the cap of %d connections", m, limit)
	}
	// And new connections are served again.
	keep.CloseIdleConnections()
	get()
}

// A JSON body sent too slowly is cut off with 408, without a timeout for
// whole requests.
func TestJSONBodyDeadline(t *testing.T) {
	defer func(d time.Duration) { jsonBodyTimeout = d }(jsonBodyTimeout)
	jsonBodyTimeout = 100 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v map[string]any
		if err := decode(w, r, &v); err != nil {
			writeProblem(w, r, err)
			return
		}
		// The deadline ended with the read: the request goes on for as
		// long as it takes (a build, a stream), not cancelled by it.
		<-time.After(5 * jsonBodyTimeout)
		fmt.Fprintf(w, "context: %v", r.Context().Err())
	})
	_, addr := serveTest(t, h, 0)

	slow := rawRequest(t, addr, "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	if got := status(t, slow); !strings.Contains(got, "408") {
		t.Errorf("a body that stalls: %q, want 408", got)
	}

	body := `{"a": 1}`
	c := rawRequest(t, addr, fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(got) != "context: <nil>" {
		t.Errorf("after a body read in time: %d %q", resp.StatusCode, got)
	}
}

// A request whose body never comes, answered without reading it (a 401),
// does not hold its connection: the server's read of the rest before it
// answers has a deadline.
func TestUnreadBodyDoesNotHoldTheConnection(t *testing.T) {
	defer func(d time.Duration) { bodyDrainTimeout = d }(bodyDrainTimeout)
	bodyDrainTimeout = 100 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no token", http.StatusUnauthorized)
	})
	_, addr := serveTest(t, h, 0)
	c := rawRequest(t, addr, "PUT /v1/sandboxes/sb-1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	if got := status(t, c); !strings.Contains(got, "401") {
		t.Errorf("status %q, want 401", got)
	}
}

// The cap hands connections over as accepted: on the Unix socket the
// audit log still learns the peer's uid (PeerContext needs the
// *net.UnixConn).
func TestHTTPServerCapKeepsUnixPeer(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, peerOf(r)) })
	s := NewHTTPServer(h, 2)
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://forkd/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	peer, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(peer), "unix:uid=") {
		t.Errorf("peer %q, want the Unix socket's uid", peer)
	}
}

// And a TLS listener keeps TLS and HTTP/2: http.Server negotiates them
// only on the *tls.Conn the listener accepted.
func TestHTTPServerCapKeepsTLSAndHTTP2(t *testing.T) {
	certs := httptest.NewUnstartedServer(nil)
	certs.EnableHTTP2 = true
	certs.StartTLS() // for its certificate and a client that trusts it
	defer certs.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s tls=%v", r.Proto, r.TLS != nil)
	})
	s := NewHTTPServer(h, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(tls.NewListener(ln, certs.TLS.Clone()))
	defer s.Close()
	c := certs.Client()
	c.Timeout = time.Minute
	resp, err := c.Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if string(got) != "HTTP/2.0 tls=true" {
		t.Errorf("served %q, want HTTP/2 over TLS", got)
	}
}
