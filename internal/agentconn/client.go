package agentconn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// BaseURL is the base of every request URL sent through a Session's HTTP
// client. The host name is never resolved: the transport dials by opening a
// yamux stream.
const BaseURL = "http://forkd-agent"

// Session is the host side of one agent session.
type Session struct {
	mux       *yamux.Session
	transport *http.Transport
	client    *http.Client
	ready     agentapi.Ready
}

// Dial performs the handshake on conn (write the HELLO, skip everything up to
// the READY line that echoes its nonce; resynchronize once if none comes
// within a second, see handshake) and starts a yamux client session over
// conn. ctx bounds the handshake only. The returned Ready carries the nonce
// that was answered, which differs from hello.Nonce after a resync. On success the Session owns conn;
// on failure the caller still does (conn may hold a half-read stream and is
// best closed).
//
// A READY carrying an error (the agent refused the Hello) fails with
// errdefs.ErrFailedPrecondition, as does an agent speaking another protocol
// version.
func Dial(ctx context.Context, conn net.Conn, hello agentapi.Hello) (*Session, agentapi.Ready, error) {
	if hello.Nonce == "" {
		hello.Nonce = newNonce()
	}
	ready, rest, err := handshake(ctx, conn, hello)
	if err != nil {
		return nil, agentapi.Ready{}, err
	}
	if ready.Error != "" {
		return nil, ready, fmt.Errorf("agent refused HELLO: %s: %w", ready.Error, errdefs.ErrFailedPrecondition)
	}
	if v := ready.Info.ProtocolVersion; v != agentapi.Version {
		return nil, ready, fmt.Errorf("agent speaks protocol version %d, host %d: %w", v, agentapi.Version, errdefs.ErrFailedPrecondition)
	}
	refusing := make(chan struct{})
	mux, err := yamux.Client(&prefixConn{Conn: conn, rest: rest, start: refusing}, yamuxConfig(newLogLimiter(func(f string, a ...any) {
		log.Printf("agentconn: "+f, a...)
	}).printf))
	if err != nil {
		return nil, ready, fmt.Errorf("agentconn: yamux: %w", err)
	}
	// The host never accepts a stream: the agent serves, the host only
	// opens. yamux would still queue up to AcceptBacklog (256) streams the
	// guest opens, each holding the 256 KiB its window lets the guest send
	// (a hostile guest pinned 128 MiB of daemon heap that way). After a
	// GoAway, yamux resets every stream the guest opens before allocating
	// it and drops the data sent on it; the host's own streams are
	// unaffected (a GoAway only stops the side that receives it). yamux
	// reads nothing until the GoAway is in effect (prefixConn.start),
	// so streams opened in the same write as READY are refused too. The
	// frame goes out in the background: Dial does not wait for the port.
	go func() {
		_ = mux.GoAway() // fails only when the session is gone
		close(refusing)
	}()
	s := &Session{mux: mux, ready: ready}
	s.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return mux.Open()
		},
		Proxy:               nil,
		DisableCompression:  true, // bodies are already local; don't spend guest CPU
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64, // concurrent requests reuse streams
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
		// The agent's response headers are a few short lines; net/http
		// would otherwise buffer up to 10 MiB of them per stream.
		MaxResponseHeaderBytes: maxResponseHeader,
	}
	s.client = &http.Client{Transport: s.transport}
	return s, ready, nil
}

// maxResponseHeader bounds the status line and headers of an agent
// response (see Dial): a guest that sends more fails that request.
const maxResponseHeader = 64 << 10

// resyncAfter is how long Dial waits for READY before it resynchronizes the
// stream (see handshake). A restored agent answers in tens of milliseconds;
// a cold boot takes seconds, and then the resync only costs one extra
// megabyte through the port.
var resyncAfter = time.Second

// resyncPreamble is sent before a second HELLO when the first got no
// answer. An agent that is inside a stale session may be in the middle of a
// frame its old host never finished (a snapshot taken while the host was
// writing, then restored, with no EOF in between): it would take the HELLO
// for payload. Zeros longer than any frame the agent accepts (a partial
// header, then at most streamWindow of payload) complete that frame, and a
// header of zeros (a data frame on stream 0) is invalid, so the agent then
// ends the session and scans for the HELLO that follows. An agent awaiting
// a HELLO just discards the zeros.
func resyncPreamble() []byte { return make([]byte, streamWindow+4*yamuxHeaderLen) }

// handshake writes the HELLO and reads up to the matching READY line. It
// returns the bytes read after that line, which belong to yamux. If no READY
// comes within resyncAfter, it resynchronizes once: preamble, then the HELLO
// with a new nonce, so an answer to the first HELLO (whose session the
// preamble ends) is skipped.
func handshake(ctx context.Context, conn net.Conn, hello agentapi.Hello) (agentapi.Ready, []byte, error) {
	// conn deadlines follow ctx for the handshake only.
	ctxDeadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(ctxDeadline)
	canceled := time.Unix(1, 0)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(canceled) })
	defer func() {
		stop()
		_ = conn.SetDeadline(time.Time{})
	}()
	// setReadDeadline sets an earlier read deadline without losing a
	// cancellation that raced with it.
	setReadDeadline := func(t time.Time) {
		if !ctxDeadline.IsZero() && (t.IsZero() || ctxDeadline.Before(t)) {
			t = ctxDeadline
		}
		_ = conn.SetReadDeadline(t)
		if ctx.Err() != nil {
			_ = conn.SetDeadline(canceled)
		}
	}
	wrap := func(op string, err error) error {
		// Only ctx sets deadlines on conn here, so a deadline error is ctx's
		// (whose own timer may not have fired yet).
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if errors.Is(ctx.Err(), context.Canceled) {
				return fmt.Errorf("agent handshake: %s: %w", op, errdefs.ErrCanceled)
			}
			return fmt.Errorf("agent handshake: %s: no READY in time: %w", op, errdefs.ErrDeadlineExceeded)
		}
		return fmt.Errorf("agent handshake: %s: %v: %w", op, err, errdefs.ErrUnavailable)
	}
	helloLine := func(h agentapi.Hello) ([]byte, error) {
		b, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("agent handshake: %w", err)
		}
		return append(append([]byte(agentapi.HelloPrefix), b...), '\n'), nil
	}

	line, err := helloLine(hello)
	if err != nil {
		return agentapi.Ready{}, nil, err
	}
	if _, err := conn.Write(line); err != nil {
		return agentapi.Ready{}, nil, wrap("writing HELLO", err)
	}
	resyncAt := time.Now().Add(resyncAfter)
	resynced := false
	// The resync is written by a goroutine while this one reads: the agent
	// may be writing READY for the first HELLO meanwhile, and on a
	// synchronous conn neither side could finish otherwise. It has finished
	// by the time the second READY arrives (the agent read all of it), and
	// must have before handshake returns, since yamux writes next.
	var resyncDone chan error
	finish := func(err error) error {
		if resyncDone == nil {
			return err
		}
		if err != nil {
			_ = conn.SetDeadline(canceled)
		}
		if werr := <-resyncDone; err == nil && werr != nil {
			return wrap("resynchronizing", werr)
		}
		return err
	}

	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		for {
			body, consumed, ok := scanLine(buf, agentapi.ReadyPrefix)
			if !ok {
				buf = buf[consumed:]
				break
			}
			buf = buf[consumed:]
			var r agentapi.Ready
			if json.Unmarshal(body, &r) == nil && r.Nonce == hello.Nonce {
				if err := finish(nil); err != nil {
					return agentapi.Ready{}, nil, err
				}
				return r, buf, nil
			}
			// A stale READY (an earlier handshake, the answer to the HELLO
			// before a resync, or bytes inside old frames): keep looking.
		}
		if !resynced {
			setReadDeadline(resyncAt)
		}
		n, err := conn.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if err == nil || n > 0 {
			continue // scan what came (with the error, if any) first
		}
		if !resynced && errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && time.Now().After(resyncAt) {
			resynced = true
			setReadDeadline(time.Time{})
			hello.Nonce = newNonce()
			if line, err = helloLine(hello); err != nil {
				return agentapi.Ready{}, nil, err
			}
			resyncDone = make(chan error, 1)
			go func(b []byte) {
				_, err := conn.Write(b)
				resyncDone <- err
			}(append(resyncPreamble(), line...))
			continue
		}
		return agentapi.Ready{}, nil, finish(wrap("waiting for READY", err))
	}
}

func newNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// HTTPClient returns the client whose requests travel over this session.
// Request URLs start with BaseURL.
func (s *Session) HTTPClient() *http.Client { return s.client }

// Ready returns the agent's answer to the handshake.
func (s *Session) Ready() agentapi.Ready { return s.ready }

// Done is closed when the session ends (Close, or the connection failed).
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// CloseIdleConnections closes the streams kept for later requests. After
// Quiesce the agent serves no more requests on this session; with no idle
// stream left, a later request fails at once (the agent's GoAway refuses a
// new stream) instead of waiting on a stream nobody reads.
func (s *Session) CloseIdleConnections() { s.transport.CloseIdleConnections() }

// Close ends the session and closes its connection. To re-attach to the same
// VM, connect again and Dial.
func (s *Session) Close() error {
	// The session first: closing idle streams of a live session writes
	// close frames, which fail noisily when the VM is already gone.
	err := s.mux.Close()
	s.transport.CloseIdleConnections()
	return err
}

// prefixConn returns bytes read past the READY line before reading conn,
// and nothing at all before start is closed.
type prefixConn struct {
	net.Conn
	rest  []byte
	start <-chan struct{}
}

func (c *prefixConn) Read(p []byte) (int, error) {
	<-c.start
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

var _ io.ReadWriteCloser = (*prefixConn)(nil)
