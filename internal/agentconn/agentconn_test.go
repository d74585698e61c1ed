package agentconn

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn/agentconntest"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// testAgent runs Serve on a fakePort with a small handler:
//
//	/v1/info     -> Info with the sandbox id of the last HELLO
//	/echo        -> the request body
//	/v1/quiesce  -> {} then EndSession
//	/touch       -> counts the request, answers 204
type testAgent struct {
	touched atomic.Int64
	port    *eofPort
	hellos  atomic.Int64
	mu      sync.Mutex
	sandbox string
	// holdHello, if set, is waited for (closed) before OnHello answers.
	holdHello chan struct{}
	refuse    atomic.Bool
	served    chan error
}

// eofPort is a Port that counts the EOFs the agent reads, so that a test
// can wait until the agent has seen a disconnect.
type eofPort struct {
	*agentconntest.Port
	eofs atomic.Int64
}

func (p *eofPort) Read(b []byte) (int, error) {
	n, err := p.Port.Read(b)
	if err == io.EOF {
		p.eofs.Add(1)
	}
	return n, err
}

// waitEOF waits until the agent has read more than seen EOFs.
func (p *eofPort) waitEOF(t *testing.T, seen int64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); p.eofs.Load() <= seen; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent read no EOF")
		}
	}
}

func startAgent(t *testing.T) *testAgent {
	t.Helper()
	a := &testAgent{port: &eofPort{Port: &agentconntest.Port{}}, served: make(chan error, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+agentapi.PathInfo, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(a.info())
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		// Stream the body back while it is still arriving.
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			t.Errorf("EnableFullDuplex: %v", err)
		}
		io.Copy(w, r.Body)
	})
	mux.HandleFunc("POST /touch", func(w http.ResponseWriter, r *http.Request) {
		a.touched.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+agentapi.PathQuiesce, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "3")
		w.Header().Set("Connection", "close")
		io.WriteString(w, "{}\n")
		if err := EndSession(w, r); err != nil {
			t.Errorf("EndSession: %v", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	srv := &Server{
		Handler: mux,
		OnHello: func(h agentapi.Hello) (agentapi.Info, error) {
			a.hellos.Add(1)
			a.mu.Lock()
			hold := a.holdHello
			a.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-time.After(time.Minute):
				}
			}
			if a.refuse.Load() {
				return agentapi.Info{}, errors.New("identity refused")
			}
			a.mu.Lock()
			a.sandbox = h.Identity.SandboxID
			a.mu.Unlock()
			return a.info(), nil
		},
		Logf: testLogf(t),
	}
	go func() { a.served <- srv.Serve(ctx, a.port) }()
	t.Cleanup(func() {
		cancel()
		a.port.Close()
		select {
		case <-a.served:
		case <-time.After(time.Minute):
			t.Error("Serve did not return")
		}
	})
	return a
}

// testLogf logs through t only while the test runs: sessions close in the
// background and may log after the test returned.
func testLogf(t *testing.T) func(string, ...any) {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf(f, a...)
		}
	}
}

func (a *testAgent) info() agentapi.Info {
	a.mu.Lock()
	defer a.mu.Unlock()
	return agentapi.Info{AgentVersion: "test", ProtocolVersion: agentapi.Version, SandboxID: a.sandbox}
}

func hello(id string) agentapi.Hello {
	return agentapi.Hello{Identity: agentapi.Identity{SandboxID: id, UnixNano: time.Now().UnixNano(), Entropy: make([]byte, 32)}}
}

func dial(t *testing.T, conn net.Conn, id string) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, ready, err := Dial(ctx, conn, hello(id))
	if err != nil {
		t.Fatalf("Dial(%s): %v", id, err)
	}
	if ready.Info.SandboxID != id {
		t.Fatalf("READY sandbox = %q, want %q", ready.Info.SandboxID, id)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func getInfo(ctx context.Context, s *Session) (agentapi.Info, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", BaseURL+agentapi.PathInfo, nil)
	resp, err := s.HTTPClient().Do(req)
	if err != nil {
		return agentapi.Info{}, err
	}
	defer resp.Body.Close()
	var info agentapi.Info
	return info, json.NewDecoder(resp.Body).Decode(&info)
}

func mustInfo(t *testing.T, s *Session, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := getInfo(ctx, s)
	if err != nil {
		t.Fatalf("info: %v", err)
	}
	if info.SandboxID != want {
		t.Fatalf("info sandbox = %q, want %q", info.SandboxID, want)
	}
}

func echo(ctx context.Context, s *Session, body []byte) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", BaseURL+"/echo", bytes.NewReader(body))
	resp, err := s.HTTPClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// prefixWriteConn prepends junk to its first Write, in the same write, so
// the agent reads garbage and the HELLO together.
type prefixWriteConn struct {
	net.Conn
	once sync.Once
	junk []byte
}

func (c *prefixWriteConn) Write(b []byte) (int, error) {
	var junk []byte
	c.once.Do(func() { junk = c.junk })
	if junk != nil {
		n, err := c.Conn.Write(append(append([]byte(nil), junk...), b...))
		return max(0, n-len(junk)), err
	}
	return c.Conn.Write(b)
}

func TestHandshakeSkipsGarbageBeforeHelloAndReady(t *testing.T) {
	// No resync (a second HELLO) however slowly the agent answers.
	old := resyncAfter
	resyncAfter = time.Hour
	defer func() { resyncAfter = old }()
	a := startAgent(t)
	// The agent -> host direction starts with stale bytes, including a READY
	// from an older handshake (wrong nonce) that the host must skip.
	a.port.SetStale([]byte("\x00\x01\x00\x00old frame bytes FORKD-READY {\"nonce\":\"stale\",\"info\":{\"sandbox_id\":\"old\"}}\n\xff\xfe"))
	conn := a.port.Connect()
	junk := []byte("\x00\x00\x00\x01binary junk\nFORKD-HEL\nnot json: FORKD-HELLO {broken\n")
	s := dial(t, &prefixWriteConn{Conn: conn, junk: junk}, "sb-a")
	mustInfo(t, s, "sb-a")
	if n := a.hellos.Load(); n != 1 {
		t.Fatalf("OnHello called %d times, want 1", n)
	}
}

func TestRefusedHelloThenRetry(t *testing.T) {
	a := startAgent(t)
	a.refuse.Store(true)
	conn := a.port.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, ready, err := Dial(ctx, conn, hello("sb-x"))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "identity refused") {
		t.Fatalf("Dial with refused identity: err = %v, want failed precondition with the agent's reason", err)
	}
	if ready.Error == "" {
		t.Fatalf("Ready.Error empty")
	}
	// The agent keeps waiting for a HELLO on the same stream.
	a.refuse.Store(false)
	s := dial(t, conn, "sb-y")
	mustInfo(t, s, "sb-y")
}

func TestNewHelloWhileOldSessionIsStale(t *testing.T) {
	a := startAgent(t)
	s1 := dial(t, a.port.Connect(), "template")
	mustInfo(t, s1, "template")
	// Leave an idle stream and a finished large transfer in the old
	// session, as a busy template would.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("x"), 1<<20)
	if got, err := echo(ctx, s1, big); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("echo before restore: %v (len %d)", err, len(got))
	}

	// "Restore": a new host appears on the same stream; the agent never
	// sees EOF and is still in the old session. The HELLO arrives in the
	// same read as garbage.
	conn2 := a.port.Swap()
	s2 := dial(t, &prefixWriteConn{Conn: conn2, junk: []byte("\x07stale")}, "child-1")
	mustInfo(t, s2, "child-1")

	// And again with a HELLO that lands exactly at a frame boundary.
	s3 := dial(t, a.port.Swap(), "child-2")
	mustInfo(t, s3, "child-2")
	if got, err := echo(ctx, s3, big); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("echo after restore: %v (len %d)", err, len(got))
	}
}

func TestHostDisconnectThenNewHost(t *testing.T) {
	a := startAgent(t)
	s1 := dial(t, a.port.Connect(), "one")
	mustInfo(t, s1, "one")
	eofs := a.port.eofs.Load()
	s1.Close() // host goes away: the agent reads EOF
	// Wait until the agent has noticed (its reads keep returning EOF).
	a.port.waitEOF(t, eofs)
	s2 := dial(t, a.port.Connect(), "two")
	mustInfo(t, s2, "two")
}

// TestStaleEOFAfterNewHello: a new host's HELLO reaches the agent before
// the port reports the earlier host's disconnect (an EOF that belongs to
// the old connection, seen when a daemon restarts quickly under load). The
// new session must keep serving: the host cannot tell that the agent
// dropped it, and its requests would wait forever.
func TestStaleEOFAfterNewHello(t *testing.T) {
	a := startAgent(t)
	s1 := dial(t, a.port.Connect(), "old-daemon")
	mustInfo(t, s1, "old-daemon")
	// The old daemon goes; the new one's HELLO arrives before the agent
	// learns of it.
	s2 := dial(t, a.port.Swap(), "new-daemon")
	eofs := a.port.eofs.Load()
	a.port.StaleEOF()
	a.port.waitEOF(t, eofs) // the agent reads the EOF
	mustInfo(t, s2, "new-daemon")
	// A real disconnect and a new host still work.
	eofs = a.port.eofs.Load()
	s2.Close()
	a.port.waitEOF(t, eofs)
	s3 := dial(t, a.port.Connect(), "third")
	mustInfo(t, s3, "third")
}

func TestQuiesceThenNewHello(t *testing.T) {
	for _, how := range []string{"reconnect", "same-stream"} {
		t.Run(how, func(t *testing.T) {
			a := startAgent(t)
			s1 := dial(t, a.port.Connect(), "template")
			mustInfo(t, s1, "template")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", BaseURL+agentapi.PathQuiesce, nil)
			resp, err := s1.HTTPClient().Do(req)
			if err != nil {
				t.Fatalf("quiesce: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "{}\n" {
				t.Fatalf("quiesce: %d %q", resp.StatusCode, body)
			}
			// The agent sent a GoAway: a new stream is refused at once
			// rather than hanging.
			s1.transport.CloseIdleConnections()
			deadline := time.Now().Add(time.Minute)
			for {
				_, err := s1.mux.Open()
				if err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("old session still accepts streams after quiesce")
				}
				time.Sleep(5 * time.Millisecond)
			}

			var conn net.Conn
			if how == "reconnect" {
				s1.Close()
				conn = a.port.Connect()
			} else {
				conn = a.port.Swap()
			}
			s2 := dial(t, conn, "child")
			mustInfo(t, s2, "child")
		})
	}
}

// A request sent once the quiesce reply has arrived is never served, on a
// new stream (GoAway) or on one kept alive from before (the session
// refuses it): a template saved after the reply holds no half-done request.
func TestNoRequestServedAfterQuiesce(t *testing.T) {
	for i := range 5 {
		a := startAgent(t)
		s1 := dial(t, a.port.Connect(), "template")
		// Idle kept-alive streams, as a host has after earlier requests.
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() { defer wg.Done(); mustInfo(t, s1, "template") }()
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, _ := http.NewRequestWithContext(ctx, "POST", BaseURL+agentapi.PathQuiesce, nil)
		resp, err := s1.HTTPClient().Do(req)
		if err != nil {
			t.Fatalf("quiesce: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if !resp.Close {
			t.Errorf("quiesce reply lets the host keep its stream (no Connection: close)")
		}

		// Right after the reply: a new stream, and requests on the kept
		// streams. A request may fail or get a 503, or go unanswered
		// (the session ended before the agent read it); bounded here.
		short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(short, "POST", BaseURL+"/touch", nil)
				if resp, err := s1.HTTPClient().Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode != http.StatusServiceUnavailable {
						t.Errorf("request after quiesce: %s, want 503 or an error", resp.Status)
					}
				}
			}()
		}
		if _, err := s1.mux.Open(); err == nil {
			t.Errorf("run %d: a new stream opened after the quiesce reply (no GoAway before it)", i)
		}
		wg.Wait()
		cancel()
		s1.Close()
		s2 := dial(t, a.port.Connect(), "child")
		mustInfo(t, s2, "child")
		if n := a.touched.Load(); n != 0 {
			t.Fatalf("run %d: %d requests served after the quiesce reply", i, n)
		}
	}
}

func TestConcurrentRequestsMultiplexed(t *testing.T) {
	a := startAgent(t)
	s := dial(t, a.port.Connect(), "busy")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := make([]byte, 1000+i*3000) // up to ~300 KiB
			rand.Read(body)
			got, err := echo(ctx, s, body)
			if err != nil {
				errs <- fmt.Errorf("request %d: %w", i, err)
				return
			}
			if sha256.Sum256(got) != sha256.Sum256(body) {
				errs <- fmt.Errorf("request %d: body mismatch (%d bytes, want %d)", i, len(got), len(body))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Streams beyond the idle pool are closed (FIN both ways, asynchronously).
	deadline := time.Now().Add(time.Minute)
	for s.mux.NumStreams() > 64 {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams still open, want idle streams capped at 64", s.mux.NumStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServeReturnsWhenPortCloses(t *testing.T) {
	p := &eofPort{Port: &agentconntest.Port{}}
	done := make(chan error, 1)
	go func() {
		done <- Serve(context.Background(), p, http.NotFoundHandler(), func(agentapi.Hello) (agentapi.Info, error) {
			return agentapi.Info{}, nil
		})
	}()
	p.waitEOF(t, 0) // idle, reading EOF with back-off
	p.Close()
	select {
	case err := <-done:
		if !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("Serve = %v, want the port's close error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return after the port closed")
	}
}

// countingPort records when it is read while no host is connected.
type countingPort struct {
	mu    sync.Mutex
	times []time.Time
	fifth chan struct{} // closed at the fifth read
}

func (p *countingPort) Read([]byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.times = append(p.times, time.Now()); len(p.times) == 5 {
		close(p.fifth)
	}
	return 0, io.EOF
}
func (p *countingPort) Write(b []byte) (int, error) { return len(b), nil }

// TestNoHostBacksOff: with no host, the agent keeps reading its port, and
// waits between reads (1, 2, 4, 8 ms at least: a hot spin would read
// millions of times). Only lower bounds on time are checked, which load
// cannot break.
func TestNoHostBacksOff(t *testing.T) {
	p := &countingPort{fifth: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Serve(ctx, p, http.NotFoundHandler(), func(agentapi.Hello) (agentapi.Info, error) { return agentapi.Info{}, nil })
	}()
	select {
	case <-p.fifth:
	case <-time.After(time.Minute):
		t.Error("fewer than 5 reads in a minute with no host: the agent stopped retrying")
	}
	cancel()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.times) >= 5 {
		if d := p.times[4].Sub(p.times[0]); d < eofBackoffMin+2*eofBackoffMin+4*eofBackoffMin+8*eofBackoffMin {
			t.Errorf("5 reads in %v with no host, want a back-off between them (at least 15 ms in all)", d)
		}
	}
}

func TestHandshakeHonoursContext(t *testing.T) {
	agentEnd, host := net.Pipe()
	defer agentEnd.Close()
	go io.Copy(io.Discard, agentEnd) // a peer that never answers
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err := Dial(ctx, host, hello("x"))
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("Dial = %v, want deadline exceeded", err)
	}
}

// A snapshot taken while the old host was writing a frame, restored with no
// EOF in between: the agent waits for the rest of that frame and would take
// the new HELLO for payload. Dial resynchronizes after resyncAfter.
func TestResyncAfterHostDiedMidFrame(t *testing.T) {
	old := resyncAfter
	resyncAfter = 200 * time.Millisecond
	defer func() { resyncAfter = old }()

	for name, partial := range map[string][]byte{
		"payload": append(hdr(yamuxTypeData, 0, 1001, 4096), bytes.Repeat([]byte{'x'}, 100)...),
		// The HELLO's 'F' completes the length (70): the frame swallows
		// the start of the HELLO, and what follows is no header.
		"header": hdr(yamuxTypeData, 0, 1001, 0)[:11],
	} {
		t.Run(name, func(t *testing.T) {
			a := startAgent(t)
			conn1 := a.port.Connect()
			s1 := dial(t, conn1, "template")
			mustInfo(t, s1, "template")
			if _, err := conn1.Write(partial); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			s2 := dial(t, a.port.Swap(), "child")
			if d := time.Since(start); d < resyncAfter {
				t.Fatalf("READY after %v: the HELLO was not swallowed, the test proves nothing", d)
			}
			mustInfo(t, s2, "child")
			if s2.Ready().Nonce == "" {
				t.Fatal("no nonce")
			}
		})
	}
}

// A resync must not confuse an agent that was simply slow: it answers the
// first HELLO, then the preamble ends that session, and the second HELLO's
// READY is the one the host takes.
func TestResyncWithSlowAgent(t *testing.T) {
	old := resyncAfter
	resyncAfter = 50 * time.Millisecond
	defer func() { resyncAfter = old }()
	a := startAgent(t)
	// The agent answers the first HELLO only once the host has begun its
	// resync (its second write), however long that takes.
	conn := &secondWriteConn{Conn: a.port.Connect(), second: make(chan struct{})}
	a.mu.Lock()
	a.holdHello = conn.second
	a.mu.Unlock()
	s := dial(t, conn, "slow")
	mustInfo(t, s, "slow")
	if n := a.hellos.Load(); n != 2 {
		t.Fatalf("OnHello ran %d times, want 2 (original HELLO and the resync's)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("y"), 3<<20)
	if got, err := echo(ctx, s, big); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("echo after resync: %v", err)
	}
}

// secondWriteConn closes second when its second Write begins.
type secondWriteConn struct {
	net.Conn
	writes atomic.Int64
	second chan struct{}
}

func (c *secondWriteConn) Write(b []byte) (int, error) {
	if c.writes.Add(1) == 2 {
		close(c.second)
	}
	return c.Conn.Write(b)
}
