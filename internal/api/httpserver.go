package api

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxConnections is how many connections the daemon serves at once
// on each listener. Each costs a goroutine, a descriptor and some 10 KiB
// of buffers, so 4096 cost tens of MiB at most, far above what clients
// hold: one per streaming call or upload in flight, and a few idle ones
// per client pool.
const DefaultMaxConnections = 4096

// The API server's timeouts. None bounds a whole request or response:
// exec and run_code stream for as long as the command runs, uploads and
// exec's stdin stream request bodies, and port tunnels and WebSockets
// live as long as the app's connection. JSON bodies, small, get their own
// deadline while they are read (decode).
const (
	// readHeaderTimeout bounds the request line and headers: a client
	// that sends them slower holds a connection for nothing.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes keep-alive connections no request has used for
	// that long: longer than clients keep idle ones (Go's 90 s), so the
	// client closes first and never sends on a connection being closed.
	idleTimeout = 2 * time.Minute
)

// bodyDrainTimeout bounds reading what a handler left of a request body
// (an error answered before reading it: a 401, a 404). The server reads
// up to 256 KiB of it before it answers, to reuse the connection, and
// with no deadline, a client that never sends it would hold the
// connection, unauthenticated, for good.
var bodyDrainTimeout = 10 * time.Second

// HTTPServer is the API's http.Server: header and idle timeouts, peers
// recorded for the audit log (PeerContext), and at most a set number of
// connections served at once on each listener.
type HTTPServer struct {
	*http.Server
	maxConns int

	// mu guards slots: each accepted connection and the semaphore of its
	// listener, until the server is done with it.
	mu    sync.Mutex
	slots map[net.Conn]chan struct{}

	waiting atomic.Int32 // Accepts waiting for a slot (tests)
}

// NewHTTPServer builds the server for h, serving at most maxConns
// connections at once on each listener (0: no limit). Serve with its
// Serve method.
func NewHTTPServer(h http.Handler, maxConns int) *HTTPServer {
	s := &HTTPServer{maxConns: maxConns, slots: map[net.Conn]chan struct{}{}}
	s.Server = &http.Server{
		Handler:           drainBounded(h),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ConnContext:       PeerContext,
		ConnState:         s.connState,
	}
	return s
}

// Serve serves ln. Once maxConns of its connections are being served,
// the next waits to be accepted (in the kernel's listen queue) until one
// closes. A connection handed to a handler (a tunnel or WebSocket
// upgrade, authenticated like any request) no longer counts.
//
// The limit cannot wrap the connections, as netutil.LimitListener does, to
// see them close: http.Server serves TLS (and HTTP/2) only on a *tls.Conn,
// and PeerContext knows the Unix socket's peer by its *net.UnixConn. So
// the connection goes out as accepted, and the server's ConnState hook
// frees its slot.
func (s *HTTPServer) Serve(ln net.Listener) error {
	if s.maxConns > 0 {
		ln = &limitListener{Listener: ln, s: s, sem: make(chan struct{}, s.maxConns), done: make(chan struct{})}
	}
	return s.Server.Serve(ln)
}

// drainBounded sets bodyDrainTimeout as the read deadline when h returns,
// for the server's read of the rest of the body. Not on upgrades: their
// connection is the handler's (and h returns when it is done with it).
func drainBounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.ContentLength != 0 && r.Header.Get("Upgrade") == "" {
			http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyDrainTimeout))
		}
	})
}

func (s *HTTPServer) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	s.mu.Lock()
	sem, ok := s.slots[c]
	delete(s.slots, c)
	s.mu.Unlock()
	if ok {
		<-sem
	}
}

// limitListener takes a slot of sem before it accepts a connection.
type limitListener struct {
	net.Listener
	s    *HTTPServer
	sem  chan struct{}
	done chan struct{} // closed by Close: Accept waits no longer
	once sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.s.waiting.Add(1)
		select {
		case l.sem <- struct{}{}:
			l.s.waiting.Add(-1)
		case <-l.done:
			l.s.waiting.Add(-1)
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	l.s.mu.Lock()
	l.s.slots[c] = l.sem
	l.s.mu.Unlock()
	return c, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}
