package agentconn

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// hostileAgent answers the host's HELLO, then behaves as a replaced agent
// may: right behind its READY (in the same write) it opens streams of its
// own with raw yamux frames and fills each up to its initial window. It
// also serves requests with a yamux server, as a real agent would: every
// path answers Info, /big-header with 1 MiB of headers first.
func hostileAgent(t *testing.T, agent net.Conn, streams, perStream int) {
	t.Helper()
	br := bufio.NewReader(agent)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Errorf("hostile agent: reading HELLO: %v", err)
		return
	}
	var h agentapi.Hello
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), agentapi.HelloPrefix)), &h); err != nil {
		t.Errorf("hostile agent: HELLO %q: %v", line, err)
		return
	}
	// Serve requests; the yamux server reads everything the host sends
	// (the host writes nothing more before READY, so br holds nothing).
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	mux, err := yamux.Server(&bufConn{Conn: agent, r: br}, cfg)
	if err != nil {
		t.Errorf("hostile agent: yamux: %v", err)
		return
	}
	t.Cleanup(func() { mux.Close() })
	go http.Serve(mux, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big-header" {
			for i := range 16 {
				w.Header().Set(fmt.Sprintf("X-Pad-%d", i), strings.Repeat("p", 64<<10))
			}
		}
		json.NewEncoder(w).Encode(agentapi.Info{AgentVersion: "hostile", ProtocolVersion: agentapi.Version, SandboxID: h.Identity.SandboxID})
	}))

	ready, _ := json.Marshal(agentapi.Ready{Info: agentapi.Info{ProtocolVersion: agentapi.Version, SandboxID: h.Identity.SandboxID}, Nonce: h.Nonce})
	buf := append([]byte(agentapi.ReadyPrefix), ready...)
	buf = append(buf, '\n')
	const chunk = 64 << 10
	payload := make([]byte, chunk)
	for i := range streams {
		id := uint32(2 + 2*i) // server-side stream ids are even
		buf = appendFrame(buf, yamuxTypeWindowUpdate, 1 /* SYN */, id, 0, nil)
		for n := 0; n < perStream; n += chunk {
			buf = appendFrame(buf, yamuxTypeData, 0, id, chunk, payload)
		}
		// One write per stream (the first with READY): frames never
		// interleave with the yamux server's, which writes nothing
		// until the host sends a request.
		if _, err := agent.Write(buf); err != nil {
			t.Errorf("hostile agent: writing stream %d: %v", id, err)
			return
		}
		buf = buf[:0]
	}
}

// bufConn reads through r, which holds what was read ahead of Conn.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func appendFrame(b []byte, typ byte, flags uint16, id, length uint32, payload []byte) []byte {
	b = append(b, 0, typ)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, length)
	return append(b, payload...)
}

// TestGuestOpenedStreamsAreRefused: a guest that opens 256 streams and
// fills each with 256 KiB (the window yamux grants a new stream) must not
// make the host hold that data (64 MiB, 128 MiB of heap before the fix),
// and the session must keep serving requests.
func TestGuestOpenedStreamsAreRefused(t *testing.T) {
	const streams, perStream = 256, 256 << 10
	host, agent := net.Pipe()
	defer host.Close()
	defer agent.Close()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	done := make(chan struct{})
	go func() {
		defer close(done)
		hostileAgent(t, agent, streams, perStream)
	}()
	s := dial(t, host, "victim")
	select {
	case <-done: // net.Pipe: every frame was read by the host
	case <-time.After(time.Minute):
		t.Fatal("the host stopped reading the agent's frames")
	}
	// A request answered after the frames means the host handled them all
	// (yamux handles frames in order).
	mustInfo(t, s, "victim")

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use grew by %.1f MiB; %d streams open", float64(grew)/(1<<20), s.mux.NumStreams())
	if grew > 8<<20 {
		t.Errorf("heap in use grew by %d MiB after the guest opened %d streams, want under 8 MiB", grew>>20, streams)
	}
	if n := s.mux.NumStreams(); n > 1 { // the idle stream of the info request
		t.Errorf("%d streams open, want the guest's refused", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := bytes.Repeat([]byte("x"), 1<<20)
	req, _ := http.NewRequestWithContext(ctx, "POST", BaseURL+"/any", bytes.NewReader(body))
	resp, err := s.HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("a request after the attack: %v", err)
	}
	resp.Body.Close()

	// Response headers are bounded too.
	req, _ = http.NewRequestWithContext(ctx, "GET", BaseURL+"/big-header", nil)
	if resp, err := s.HTTPClient().Do(req); err == nil || !strings.Contains(err.Error(), "exceeded") {
		if err == nil {
			resp.Body.Close()
		}
		t.Errorf("1 MiB of response headers: %v, want refused", err)
	}
	mustInfo(t, s, "victim")
}

// TestLogLimiter: a flood of yamux log lines (one per bad frame a guest
// sends) passes logBurst lines per interval, then one line counting the
// rest.
func TestLogLimiter(t *testing.T) {
	var lines []string
	now := time.Unix(0, 0)
	l := newLogLimiter(func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) })
	l.now = func() time.Time { return now }
	for range 1000 {
		l.printf("bad frame")
	}
	if len(lines) != logBurst {
		t.Fatalf("%d lines logged in one interval, want %d", len(lines), logBurst)
	}
	now = now.Add(logInterval)
	l.printf("bad frame")
	if len(lines) != logBurst+2 || !strings.Contains(lines[logBurst], "990 more messages") {
		t.Errorf("after the interval: %q", lines[logBurst:])
	}
}
