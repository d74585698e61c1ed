package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// fakeWSAgent echoes stdin to stdout until stdin ends, then says "bye" on
// stderr and exits 3; it records resizes and signals.
type fakeWSAgent struct {
	startErr error
	mu       sync.Mutex
	req      agentapi.ExecRequest
	resized  []agentapi.ResizeRequest
	signals  []string
	cut      bool // the exec's context ended before stdin did
}

func (f *fakeWSAgent) ExecStarted(ctx context.Context, req agentapi.ExecRequest, stdin io.Reader, started func(int), stdout, stderr io.Writer) (agentapi.ExecEvent, error) {
	f.mu.Lock()
	f.req = req
	f.mu.Unlock()
	if f.startErr != nil {
		return agentapi.ExecEvent{}, f.startErr
	}
	started(42)
	buf := make([]byte, 1024)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if _, werr := stdout.Write(buf[:n]); werr != nil {
				return agentapi.ExecEvent{}, werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			f.mu.Lock()
			f.cut = ctx.Err() != nil
			f.mu.Unlock()
			return agentapi.ExecEvent{}, err
		}
	}
	stderr.Write([]byte("bye"))
	return agentapi.ExecEvent{Type: agentapi.EventExit, ExitCode: 3}, nil
}

func (f *fakeWSAgent) Resize(ctx context.Context, pid int, size agentapi.ResizeRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resized = append(f.resized, size)
	return nil
}

func (f *fakeWSAgent) Signal(ctx context.Context, pid int, sig string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, sig)
	return nil
}

// wsServer serves the exec WebSocket with agent, without an engine.
func wsServer(t *testing.T, agent wsAgent) (*httptest.Server, *client.Client) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc(execWSPattern, func(w http.ResponseWriter, r *http.Request) { serveExecWS(w, r, agent) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := client.NewRemote(client.Remote{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func wsCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestExecWSSession(t *testing.T) {
	f := &fakeWSAgent{}
	_, c := wsServer(t, f)
	ctx := wsCtx(t)
	s, err := c.ExecSession(ctx, "sb-1", apiv1.ExecRequest{Argv: []string{"cat"}, PTY: &apiv1.PTY{Rows: 24, Cols: 80}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.Pid != 42 {
		t.Fatalf("pid %d, want 42", s.Pid)
	}
	refused := make(chan *client.Error, 4)
	s.OnError = func(e *client.Error) { refused <- e }
	var out, errb testutil.SyncBuffer
	type result struct {
		exit apiv1.ExecWSExit
		err  error
	}
	done := make(chan result, 1)
	go func() {
		exit, err := s.Wait(ctx, &out, &errb)
		done <- result{exit, err}
	}()

	s.Write([]byte("hello "))
	testutil.WaitFor(t, "the echo", func() bool { return out.String() == "hello " })
	s.Resize(30, 100)
	s.Resize(0, 5) // refused; the session goes on
	s.Signal("SIGINT")
	s.Write([]byte("world"))
	testutil.WaitFor(t, "the second echo", func() bool { return out.String() == "hello world" })
	select {
	case e := <-refused:
		if !errors.Is(e, errdefs.ErrInvalidArgument) || !strings.Contains(e.Detail, "pty rows 0: want 1..1000") {
			t.Fatalf("refusal %v", e)
		}
	case <-ctx.Done():
		t.Fatal("no refusal of the bad resize")
	}
	f.mu.Lock()
	if len(f.resized) != 1 || f.resized[0] != (agentapi.ResizeRequest{Rows: 30, Cols: 100}) || len(f.signals) != 1 || f.signals[0] != "SIGINT" {
		t.Errorf("resized %v, signals %v", f.resized, f.signals)
	}
	// Input is always open on this transport: the body carries it.
	if !f.req.Stdin || f.req.StdinOpen || f.req.PTY == nil {
		t.Errorf("agent request %+v", f.req)
	}
	f.mu.Unlock()

	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.exit.ExitCode != 3 || r.exit.Type != apiv1.ExecWSTypeExit || errb.String() != "bye" {
		t.Fatalf("exit %+v %v, stderr %q", r.exit, r.err, errb.String())
	}
}

// Controls the server cannot use are answered with an error message; the
// session goes on.
func TestExecWSBadControls(t *testing.T) {
	srv, _ := wsServer(t, &fakeWSAgent{})
	ctx := wsCtx(t)
	conn, _, err := websocket.Dial(ctx, srv.URL+"/v1/sandboxes/sb-1/exec/ws", &websocket.DialOptions{Subprotocols: []string{apiv1.ExecWSProtocol}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	expect := func(want string) {
		t.Helper()
		typ, data, err := conn.Read(ctx)
		if err != nil || typ != websocket.MessageText || !strings.Contains(string(data), want) {
			t.Fatalf("got %v %q %v, want a message with %q", typ, data, err, want)
		}
	}
	conn.Write(ctx, websocket.MessageText, []byte(`{"argv":["cat"]}`))
	expect(`{"type":"start","pid":42}`)
	conn.Write(ctx, websocket.MessageText, []byte(`{"type":"dance"}`))
	expect(`unknown control message type \"dance\"`)
	conn.Write(ctx, websocket.MessageBinary, []byte{7, 'x'})
	expect(`stream byte 0`)
	conn.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":24,"cols":1001}`))
	expect(`pty cols 1001: want 1..1000`)
	conn.Write(ctx, websocket.MessageBinary, []byte{0, 'o', 'k'})
	typ, data, err := conn.Read(ctx)
	if err != nil || typ != websocket.MessageBinary || string(data) != "\x01ok" {
		t.Fatalf("echo %v %q %v", typ, data, err)
	}
	conn.Write(ctx, websocket.MessageText, []byte(`{"type":"close_stdin"}`))
	typ, data, _ = conn.Read(ctx)
	if typ != websocket.MessageBinary || string(data) != "\x02bye" {
		t.Fatalf("stderr %v %q", typ, data)
	}
	expect(`{"type":"exit","exit_code":3,"timed_out":false}`)
	if _, _, err := conn.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after the exit: %v, want close 1000", err)
	}
}

// A request that cannot start is an error message and close 4000+status.
func TestExecWSStartErrors(t *testing.T) {
	f := &fakeWSAgent{startErr: errors.Join(errors.New(`executable "nope" not found`), errdefs.ErrNotFound)}
	srv, c := wsServer(t, f)
	ctx := wsCtx(t)
	_, err := c.ExecSession(ctx, "sb-1", apiv1.ExecRequest{Argv: []string{"nope"}})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("start error %v", err)
	}
	for msg, code := range map[string]websocket.StatusCode{
		`{"argv":["nope"]}`: 4404,
		`{}`:                4400, // neither argv nor shell
		`{"argv":["sh"],"pty":{"rows":0,"cols":80}}`: 4400,
		`{"argv":["sh"],"bogus":1}`:                  4400,
	} {
		conn, _, err := websocket.Dial(ctx, srv.URL+"/v1/sandboxes/sb-1/exec/ws", &websocket.DialOptions{Subprotocols: []string{apiv1.ExecWSProtocol}})
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(ctx, websocket.MessageText, []byte(msg))
		typ, data, err := conn.Read(ctx)
		if err != nil || typ != websocket.MessageText || !strings.HasPrefix(string(data), `{"type":"error","error":{`) {
			t.Fatalf("%s: %v %q %v", msg, typ, data, err)
		}
		if _, _, err := conn.Read(ctx); websocket.CloseStatus(err) != code {
			t.Errorf("%s: closed with %v, want %d", msg, err, code)
		}
		conn.CloseNow()
	}
}

// A client that goes away cuts the exec (the agent kills the group).
func TestExecWSClientLeaves(t *testing.T) {
	f := &fakeWSAgent{}
	_, c := wsServer(t, f)
	s, err := c.ExecSession(wsCtx(t), "sb-1", apiv1.ExecRequest{Argv: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	testutil.WaitFor(t, "the exec to be cut", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.cut
	})
}

// Before the upgrade the daemon answers problems: not a WebSocket, no
// subprotocol, no such sandbox.
func TestExecWSBeforeUpgrade(t *testing.T) {
	srv := httptest.NewServer((&Server{Engine: nopEngine(t, "", "fkws", nil)}).Handler())
	defer srv.Close()
	url := srv.URL + "/v1/sandboxes/sb-none/exec/ws"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("plain GET: %s, want 426", resp.Status)
	}
	ctx := wsCtx(t)
	_, resp, err = websocket.Dial(ctx, url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("no subprotocol: %v %v, want 400", resp, err)
	}
	c, _ := client.NewRemote(client.Remote{Host: srv.URL})
	if _, err := c.ExecSession(ctx, "sb-none", apiv1.ExecRequest{Argv: []string{"sh"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing sandbox: %v, want not found", err)
	}
}

// The exec WebSocket is a GET that runs a process: it is audited as exec
// is, with its outcome (here a process that could not start).
func TestExecWSIsAudited(t *testing.T) {
	l, dir := openAudit(t, nil)
	s := &Server{Audit: l}
	f := &fakeWSAgent{startErr: errors.Join(errors.New("no such executable"), errdefs.ErrNotFound)}
	mux := http.NewServeMux()
	mux.HandleFunc(execWSPattern, func(w http.ResponseWriter, r *http.Request) { serveExecWS(w, r, f) })
	srv := httptest.NewServer(s.auditRequests(mux, s.auditAdmit(mux)))
	defer srv.Close()
	c, _ := client.NewRemote(client.Remote{Host: srv.URL})
	if _, err := c.ExecSession(wsCtx(t), "sb-1", apiv1.ExecRequest{Argv: []string{"nope"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("exec: %v", err)
	}
	var recs []audit.Record
	testutil.WaitFor(t, "the audit record", func() bool { recs = tailAll(t, dir); return len(recs) == 1 })
	if r := recs[0]; r.Action != execWSPattern || r.Outcome == audit.OutcomeOK || !strings.Contains(r.Error, "no such executable") ||
		len(r.Targets) != 1 || r.Targets[0] != "sb-1" {
		t.Errorf("record %+v", r)
	}
}
