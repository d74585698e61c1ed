package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// Back-off while the port reads EOF (no host connected). The first retries
// are quick so a host that connects right after a restore is served fast;
// the cap keeps an idle agent from burning an emulated CPU.
const (
	eofBackoffMin = 1 * time.Millisecond
	eofBackoffMax = 10 * time.Millisecond
	readChunk     = 64 << 10
)

// Server is the guest side of the transport. The zero value is not usable:
// Handler and OnHello are required.
type Server struct {
	// Handler serves every request of every session.
	Handler http.Handler
	// OnHello applies a Hello (the new host's identity) and returns the Info
	// to answer READY with. It runs before READY is written, so no request
	// can observe the previous identity. An error is reported in
	// Ready.Error and no session starts.
	OnHello func(agentapi.Hello) (agentapi.Info, error)
	// Logf logs transport events; nil uses the log package.
	Logf func(format string, args ...any)
	// Connection says the port is one connection (a vsock stream), not a
	// device that outlives hosts (virtio-serial): its EOF, or any read
	// error, ends Serve with an error wrapping io.EOF or that error,
	// instead of waiting for another host on the same port.
	Connection bool

	wmu      sync.Mutex // serializes writes to the port (READY lines, yamux frames)
	sessions atomic.Int64
}

// Serve runs the guest side of the transport on port until ctx is done or
// the port is closed (reads fail with os.ErrClosed or io.ErrClosedPipe).
// It is a convenience for (&Server{...}).Serve.
func Serve(ctx context.Context, port io.ReadWriter, h http.Handler, onHello func(agentapi.Hello) (agentapi.Info, error)) error {
	s := &Server{Handler: h, OnHello: onHello}
	return s.Serve(ctx, port)
}

// readEvent is what the port reader hands to the session loop.
type readEvent struct {
	data []byte // bytes read (owned by the receiver)
	eof  bool   // a read returned no bytes: no host is connected
	err  error  // the port is unusable; Serve returns it
}

// Serve runs the handshake/session loop on port. Only one goroutine (started
// here) ever reads port; when Serve returns because ctx is done, that reader
// may stay blocked in Read until the caller closes the port.
func (s *Server) Serve(ctx context.Context, port io.ReadWriter) error {
	if s.Handler == nil || s.OnHello == nil {
		return errors.New("agentconn: Server needs a Handler and OnHello")
	}
	events := make(chan readEvent, 8)
	done := make(chan struct{})
	defer close(done)
	go s.readLoop(port, events, done)

	var buf []byte
	for {
		hello, rest, err := s.awaitHello(ctx, events, buf)
		if err != nil {
			return err
		}
		t0 := time.Now()
		info, herr := s.OnHello(hello)
		ready := agentapi.Ready{Info: info, Nonce: hello.Nonce}
		if herr != nil {
			ready.Error = herr.Error()
			s.logf("HELLO for sandbox %q refused: %v", hello.Identity.SandboxID, herr)
		}
		if err := s.writeLine(port, agentapi.ReadyPrefix, ready); err != nil {
			s.logf("writing READY: %v", err)
			buf = rest
			continue
		}
		if herr != nil {
			buf = rest
			continue
		}
		n := s.sessions.Add(1)
		s.logf("session %d: sandbox %q ready in %v", n, hello.Identity.SandboxID, time.Since(t0).Round(time.Microsecond))
		buf, err = s.runSession(ctx, n, port, events, rest)
		if err != nil {
			return err
		}
	}
}

// readLoop is the only reader of port. It hands every chunk to the session
// loop, reports transitions to "no host" (EOF) once, and backs off while
// the port keeps reading EOF.
func (s *Server) readLoop(port io.Reader, out chan<- readEvent, done <-chan struct{}) {
	send := func(ev readEvent) bool {
		select {
		case out <- ev:
			return true
		case <-done:
			return false
		}
	}
	buf := make([]byte, readChunk)
	backoff := eofBackoffMin
	atEOF := false
	for {
		n, err := port.Read(buf)
		if n > 0 {
			atEOF, backoff = false, eofBackoffMin
			if !send(readEvent{data: append([]byte(nil), buf[:n]...)}) {
				return
			}
		}
		switch {
		case n > 0 && err == nil:
			continue
		case s.Connection && (errors.Is(err, io.EOF) || (err == nil && n == 0)):
			send(readEvent{err: fmt.Errorf("agentconn: the host closed the connection: %w", io.EOF)})
			return
		case s.Connection && err != nil:
			send(readEvent{err: fmt.Errorf("agentconn: connection: %w", err)})
			return
		case err == nil || errors.Is(err, io.EOF):
			if n > 0 {
				continue
			}
			if !atEOF {
				atEOF = true
				if !send(readEvent{eof: true}) {
					return
				}
			}
		case errors.Is(err, os.ErrClosed) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, net.ErrClosed):
			send(readEvent{err: fmt.Errorf("agentconn: agent port closed: %w", err)})
			return
		default:
			s.logf("reading agent port: %v", err)
			backoff = eofBackoffMax
		}
		select {
		case <-time.After(backoff):
		case <-done:
			return
		}
		backoff = min(2*backoff, eofBackoffMax)
	}
}

// awaitHello discards bytes until a complete HELLO line, and returns it with
// the bytes that followed it.
func (s *Server) awaitHello(ctx context.Context, events <-chan readEvent, buf []byte) (agentapi.Hello, []byte, error) {
	for {
		for {
			line, consumed, ok := scanLine(buf, agentapi.HelloPrefix)
			if !ok {
				buf = buf[consumed:]
				break
			}
			rest := buf[consumed:]
			var h agentapi.Hello
			if err := json.Unmarshal(line, &h); err != nil {
				s.logf("ignoring malformed HELLO: %v", err)
				buf = rest
				continue
			}
			return h, rest, nil
		}
		select {
		case ev := <-events:
			switch {
			case ev.err != nil:
				return agentapi.Hello{}, nil, ev.err
			case ev.eof:
				buf = nil // a half-sent HELLO died with its host
			default:
				buf = appendBytes(buf, ev.data)
			}
		case <-ctx.Done():
			return agentapi.Hello{}, nil, ctx.Err()
		}
	}
}

// runSession serves one yamux session until it ends, and returns the bytes
// read but not consumed by it (to be scanned for a HELLO). The error is
// non-nil only when Serve must return.
func (s *Server) runSession(ctx context.Context, n int64, port io.Writer, events <-chan readEvent, pending []byte) ([]byte, error) {
	sc := newSessionConn(port, &s.wmu)
	mux, err := yamux.Server(sc, yamuxConfig(func(f string, a ...any) {
		// yamux complains when its writes fail after the session ended;
		// that is how every session ends here.
		if msg := fmt.Sprintf(f, a...); !strings.Contains(msg, errSessionEnded.Error()) {
			s.logf("session %d: %s", n, msg)
		}
	}))
	if err != nil {
		return pending, fmt.Errorf("agentconn: yamux: %w", err)
	}
	ctl := &sessionCtl{mux: mux, end: make(chan struct{})}
	srv := &http.Server{
		Handler:  ctl.guard(s.Handler),
		ErrorLog: log.New(logWriter(s.logf), "http: ", 0),
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(ctx, sessionKey{}, ctl)
		},
	}
	go srv.Serve(mux) //nolint:errcheck // ends with the session
	defer func() {
		// Stop this session's writes before anything else is written to the
		// port (the next READY); closing the session and its HTTP
		// connections can then happen in the background, since yamux's
		// Close waits for a writer that may be blocked on a port with no
		// host.
		sc.Close()
		go func() {
			srv.Close()
			mux.Close()
		}()
	}()

	ft := frameTracker{maxData: streamWindow}
	sawEOF := false
	for {
		k, bad := ft.advance(pending)
		if k > 0 {
			w, err := sc.feed(pending[:k])
			if err != nil {
				s.logf("session %d: closed by yamux: %v", n, err)
				return pending[w:], nil
			}
			pending = pending[k:]
		}
		if bad {
			s.logf("session %d: ended by non-yamux bytes from the host (%q); awaiting HELLO", n, head(pending))
			return pending, nil
		}
		select {
		case ev := <-events:
			switch {
			case ev.err != nil:
				return nil, ev.err
			case ev.eof:
				// The session stays. The host may be gone, but this EOF
				// may also be the late notice of an earlier host's
				// disconnect, read after this session's host sent its
				// HELLO: ending the session then would drop its frames
				// while the host waits for answers that never come. A
				// next host's HELLO ends the session anyway (it is not
				// yamux), and a HELLO stuck behind a frame a dead host
				// left half-written is found by the host's resync.
				if !sawEOF {
					s.logf("session %d: host disconnected (or an earlier host's late notice); the session stays until a HELLO", n)
				}
				sawEOF = true
			default:
				sawEOF = false
				pending = appendBytes(pending, ev.data)
			}
		case <-ctl.end:
			s.logf("session %d: quiesced; awaiting HELLO", n)
			return pending, nil
		case <-mux.CloseChan():
			s.logf("session %d: closed", n)
			return pending, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// writeLine writes prefix + JSON(v) + "\n" to the port in one write.
func (s *Server) writeLine(port io.Writer, prefix string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	line := make([]byte, 0, len(prefix)+len(b)+1)
	line = append(append(append(line, prefix...), b...), '\n')
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err = port.Write(line)
	return err
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
		return
	}
	log.Printf("agentconn: "+format, args...)
}

// appendBytes appends b to buf, reusing b itself when buf is empty.
func appendBytes(buf, b []byte) []byte {
	if len(buf) == 0 {
		return b
	}
	return append(buf, b...)
}

// head returns the first bytes of b, for log lines.
func head(b []byte) []byte {
	return b[:min(len(b), 24)]
}

// sessionConn is what a yamux server session sees as its connection: reads
// come from a pipe the session loop feeds with validated frames, writes go
// to the port under the port's write lock. Closing it never closes the
// port, and once closed it never writes to the port again.
type sessionConn struct {
	pr     *io.PipeReader
	pw     *io.PipeWriter
	port   io.Writer
	wmu    *sync.Mutex
	closed atomic.Bool
}

var errSessionEnded = errors.New("agentconn: session ended")

func newSessionConn(port io.Writer, wmu *sync.Mutex) *sessionConn {
	pr, pw := io.Pipe()
	return &sessionConn{pr: pr, pw: pw, port: port, wmu: wmu}
}

func (c *sessionConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *sessionConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// Checked under the lock: once Close has returned, a later writer of
	// the port (the next READY) holds the lock after any write of ours.
	if c.closed.Load() {
		return 0, errSessionEnded
	}
	return c.port.Write(p)
}

// feed hands host bytes to yamux; it blocks until yamux has read them, and
// fails once the session is closed.
func (c *sessionConn) feed(p []byte) (int, error) { return c.pw.Write(p) }

func (c *sessionConn) Close() error {
	c.closed.Store(true)
	c.pw.CloseWithError(io.EOF)          // yamux reads EOF
	c.pr.CloseWithError(errSessionEnded) // a blocked feed returns
	return nil
}

// sessionKey is the context key of the *sessionCtl of the session a request
// arrived on.
type sessionKey struct{}

type sessionCtl struct {
	mux *yamux.Session
	// ending is set by EndSession before its response leaves: from then on
	// no request of this session reaches the handler (see guard).
	ending atomic.Bool
	once   sync.Once
	end    chan struct{}
}

// guard refuses every request that arrives once the session is ending. A
// host may send one on a stream it already had open (HTTP keep-alive),
// which the GoAway does not stop; the session loop may still feed it to
// yamux before it sees end. Serving it would change the guest after the
// host was told it was quiesced, e.g. while a template is being saved.
func (c *sessionCtl) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.ending.Load() {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(agentapi.Problem{
				Title:  http.StatusText(http.StatusServiceUnavailable),
				Status: http.StatusServiceUnavailable,
				Detail: "the agent session was quiesced and takes no more requests: connect again with a new HELLO",
				Code:   "unavailable",
			})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// ErrNoSession is returned by EndSession for a request that did not arrive
// through Serve.
var ErrNoSession = errors.New("agentconn: request is not on an agent session")

// EndSession ends the session that carried r, after flushing w: the agent's
// quiesce handler writes its complete response (with a Content-Length and
// "Connection: close", so nothing is left to write after the handler returns
// and the host does not reuse the stream), then calls EndSession.
//
// The order is what makes the quiesce reply a promise: first the session
// stops serving (requests that arrive from now on are refused without
// reaching the handler, see guard), then a yamux GoAway goes out (the host
// opens no new streams; yamux refuses any it opens anyway), and only then
// the response, so the host learns that the session ended before it could
// send anything that would still be served. The agent then goes back to
// awaiting a HELLO; the port stays open. Requests already being served on
// other streams are not waited for: a host quiesces an idle agent.
func EndSession(w http.ResponseWriter, r *http.Request) error {
	ctl, _ := r.Context().Value(sessionKey{}).(*sessionCtl)
	if ctl == nil {
		return ErrNoSession
	}
	ctl.ending.Store(true)
	// GoAway returns once the frame is on the port; the response is still
	// in w's buffer (the handler has not returned), so it follows.
	_ = ctl.mux.GoAway() // best effort: the host may already be gone
	// Flush writes the response through the yamux stream, whose Write
	// returns only once the frame is on the port.
	err := http.NewResponseController(w).Flush()
	ctl.once.Do(func() { close(ctl.end) })
	if err != nil && !ctl.mux.IsClosed() {
		// A closed session means the host hung up, possibly right after
		// reading the reply (yamux may report the shutdown to a write
		// whose frame already left): the session is over either way.
		return fmt.Errorf("agentconn: flushing the response before ending the session: %w", err)
	}
	return nil
}
