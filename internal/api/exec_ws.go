package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// The exec WebSocket: one process with its input always open, for
// interactive clients (apiv1/execws.go has the protocol). It is authorized
// and audited as POST .../exec is (authorize.go, audit.go): a GET that
// runs a process.

const execWSPattern = "GET /v1/sandboxes/{id}/exec/ws"

// execWSRequestTimeout bounds the wait for the first message (the exec
// request) after the upgrade.
const execWSRequestTimeout = 30 * time.Second

// execWSInputQueue is how many stdin messages wait for the process while
// control messages (resize, signal) still get through; each is at most
// ExecWSReadLimit.
const execWSInputQueue = 8

// wsAgent is what the exec WebSocket needs of a sandbox's agent (an
// interface so the protocol is tested without an engine).
type wsAgent interface {
	execStarter
	Resize(ctx context.Context, pid int, size agentapi.ResizeRequest) error
	Signal(ctx context.Context, pid int, sig string) error
}

// execWS checks the caller (authorize did), the upgrade and the sandbox,
// answering a problem while it still can; then it accepts and runs the
// session.
func (s *Server) execWS(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeProblem(w, r, withStatus(http.StatusUpgradeRequired,
			fmt.Errorf("%s is a WebSocket (subprotocol %s): connect with Upgrade: websocket, or use POST /v1/sandboxes/{id}/exec: %w",
				r.URL.Path, apiv1.ExecWSProtocol, errdefs.ErrInvalidArgument)))
		return
	}
	if !offersSubprotocol(r, apiv1.ExecWSProtocol) {
		writeProblem(w, r, fmt.Errorf("the exec WebSocket speaks subprotocol %s: ask for it (Sec-WebSocket-Protocol): %w",
			apiv1.ExecWSProtocol, errdefs.ErrInvalidArgument))
		return
	}
	release, err := s.execSessions.take(s.principalOf(r), "exec WebSocket sessions")
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	defer release()
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	serveExecWS(w, r, agent)
}

// serveExecWS accepts the upgrade and runs one session with agent.
func serveExecWS(w http.ResponseWriter, r *http.Request, agent wsAgent) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{apiv1.ExecWSProtocol}})
	if err != nil {
		noteError(r, fmt.Errorf("accepting the WebSocket: %v: %w", err, errdefs.ErrInvalidArgument))
		return // Accept answered
	}
	defer conn.CloseNow()
	conn.SetReadLimit(apiv1.ExecWSReadLimit)
	// A hijacked connection does not end the request's context: the
	// session's does, when the client goes away or the process ends.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sess := &wsSession{conn: conn, r: r, agent: agent, ctx: ctx, cancel: cancel}
	sess.run()
}

// offersSubprotocol reports whether the client asked for proto.
func offersSubprotocol(r *http.Request, proto string) bool {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if strings.TrimSpace(p) == proto {
				return true
			}
		}
	}
	return false
}

// wsSession is one exec over a WebSocket.
type wsSession struct {
	conn   *websocket.Conn
	r      *http.Request
	agent  wsAgent
	ctx    context.Context // ends when the client goes away
	cancel context.CancelFunc
	// done is set once the exec ended: the client's close is then the
	// end of the protocol, not a client that left.
	done atomic.Bool
}

func (s *wsSession) run() {
	req, err := s.readRequest()
	if err != nil {
		s.fail(err)
		return
	}
	// Input is always open: the session feeds the exec's body, whose end
	// (close_stdin, or the client leaving) closes stdin or types ^D.
	req.Stdin, req.StdinOpen = true, false
	inR, inW := io.Pipe()
	defer inR.CloseWithError(errors.New("the exec ended"))
	input := make(chan []byte, execWSInputQueue)
	go feedInput(s.ctx, input, inW)

	var readers sync.WaitGroup
	defer readers.Wait()
	startedPid := -1
	started := func(pid int) {
		startedPid = pid
		if s.sendJSON(apiv1.ExecWSStart{Type: apiv1.ExecWSTypeStart, Pid: pid}) == nil {
			readers.Add(1)
			go func() {
				defer readers.Done()
				s.readControls(pid, input)
			}()
		}
	}
	exit, err := s.agent.ExecStarted(s.ctx, req, inR, started, s.output(apiv1.ExecWSStdout), s.output(apiv1.ExecWSStderr))
	s.done.Store(true)
	switch {
	case err != nil && startedPid < 0:
		s.fail(err)
		return
	case s.ctx.Err() != nil:
		// The client went away (or broke the protocol): the cut request
		// killed the process group; nobody is left to tell.
		noteError(s.r, fmt.Errorf("the client left the exec WebSocket: %w", errdefs.ErrCanceled))
		return
	case err != nil:
		noteError(s.r, err)
		exit = agentapi.ExecEvent{ExitCode: -1, Error: err.Error(), Code: errdefs.Code(err)}
	}
	if s.sendJSON(apiv1.ExecWSExit{
		Type: apiv1.ExecWSTypeExit, ExitCode: exit.ExitCode, Signal: exit.Signal, TimedOut: exit.TimedOut,
		Error: exit.Error, Code: exit.Code, DurationMicros: exit.DurationMicros,
	}) == nil {
		s.conn.Close(websocket.StatusNormalClosure, "")
	}
	s.cancel() // the control reader returns
}

// readRequest reads the first message: the JSON ExecRequest.
func (s *wsSession) readRequest() (apiv1.ExecRequest, error) {
	var req apiv1.ExecRequest
	ctx, cancel := context.WithTimeout(s.ctx, execWSRequestTimeout)
	defer cancel()
	typ, data, err := s.conn.Read(ctx)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return req, fmt.Errorf("no exec request within %s of the upgrade: send the JSON ExecRequest as the first text message: %w",
			execWSRequestTimeout, errdefs.ErrInvalidArgument)
	case err != nil:
		return req, wsReadError(err)
	case typ != websocket.MessageText:
		return req, fmt.Errorf("the first message is binary: send the JSON ExecRequest as a text message: %w", errdefs.ErrInvalidArgument)
	}
	if err := decodeStrictJSON(data, &req); err != nil {
		return req, fmt.Errorf("exec request: %w", err)
	}
	return req, checkExec(req)
}

// wsReadError classifies a failed read from the client.
func wsReadError(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) && ce.Code == websocket.StatusMessageTooBig {
		return fmt.Errorf("a message over %d bytes: %w", apiv1.ExecWSReadLimit, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("reading from the client: %v: %w", err, errdefs.ErrCanceled)
}

// fail answers an error before the process started: an error message,
// then a close with ExecWSCloseBase + the HTTP status.
func (s *wsSession) fail(err error) {
	noteError(s.r, err)
	p := ProblemOf(err, requestID(s.r))
	if s.ctx.Err() != nil || errors.Is(err, errdefs.ErrCanceled) {
		return // the client is gone
	}
	if s.sendJSON(apiv1.ExecWSError{Type: apiv1.ExecWSTypeError, Error: p}) == nil {
		s.conn.Close(websocket.StatusCode(apiv1.ExecWSCloseBase+p.Status), clipReason(p.Code))
	}
}

// clipReason bounds a close reason to what a close frame holds.
func clipReason(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}

// sendJSON writes one text message. A failed write ends the session.
func (s *wsSession) sendJSON(v any) error {
	b, err := json.Marshal(v)
	if err == nil {
		err = s.conn.Write(s.ctx, websocket.MessageText, b)
	}
	if err != nil {
		s.cancel()
	}
	return err
}

// output is the writer of one output stream: binary messages with the
// stream's byte first. A client that stops reading holds the process's
// output (the agent's pipe fills), as a slow HTTP client does.
func (s *wsSession) output(stream byte) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		msg := make([]byte, 1+len(p))
		msg[0] = stream
		copy(msg[1:], p)
		if err := s.conn.Write(s.ctx, websocket.MessageBinary, msg); err != nil {
			s.cancel()
			return 0, err
		}
		return len(p), nil
	})
}

// readControls reads the client's messages after the start until the
// session ends: stdin goes to input (closed by close_stdin), controls act
// on the process pid. A read error (the client left, a message over the
// limit) ends the session, which kills the process group.
func (s *wsSession) readControls(pid int, input chan<- []byte) {
	inputOpen := true
	defer func() {
		if inputOpen {
			close(input)
		}
	}()
	for {
		typ, data, err := s.conn.Read(s.ctx)
		if err != nil {
			if s.ctx.Err() == nil && !s.done.Load() {
				noteError(s.r, wsReadError(err))
			}
			s.cancel()
			return
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 || data[0] != apiv1.ExecWSStdin {
				s.refuse(fmt.Errorf("a binary message must start with stream byte %d (stdin): %w", apiv1.ExecWSStdin, errdefs.ErrInvalidArgument))
				continue
			}
			if !inputOpen {
				s.refuse(fmt.Errorf("stdin is closed (close_stdin was sent): %w", errdefs.ErrFailedPrecondition))
				continue
			}
			select {
			case input <- data[1:]:
			case <-s.ctx.Done():
				return
			}
			continue
		}
		var c apiv1.ExecWSControl
		if err := decodeStrictJSON(data, &c); err != nil {
			s.refuse(fmt.Errorf("control message: %w", err))
			continue
		}
		switch c.Type {
		case apiv1.ExecWSTypeResize:
			size := apiv1.ResizeRequest{Rows: c.Rows, Cols: c.Cols}
			if err := checkPTY(size); err != nil {
				s.refuse(err)
			} else if err := s.agent.Resize(s.ctx, pid, size); err != nil {
				s.refuse(err)
			}
		case apiv1.ExecWSTypeSignal:
			if err := s.agent.Signal(s.ctx, pid, strings.TrimSpace(c.Signal)); err != nil {
				s.refuse(err)
			}
		case apiv1.ExecWSTypeCloseStdin:
			if inputOpen {
				inputOpen = false
				close(input)
			}
		default:
			s.refuse(fmt.Errorf("unknown control message type %q: want %s, %s or %s: %w", c.Type,
				apiv1.ExecWSTypeResize, apiv1.ExecWSTypeSignal, apiv1.ExecWSTypeCloseStdin, errdefs.ErrInvalidArgument))
		}
	}
}

// refuse answers a bad control message; the process runs on.
func (s *wsSession) refuse(err error) {
	if s.ctx.Err() != nil {
		return
	}
	s.sendJSON(apiv1.ExecWSError{Type: apiv1.ExecWSTypeError, Error: ProblemOf(err, requestID(s.r))})
}

// feedInput writes the client's stdin messages to the exec's body in
// order, and ends the body when input is closed. Once the process stops
// reading its input (the exec ended) the rest is dropped.
func feedInput(ctx context.Context, input <-chan []byte, w *io.PipeWriter) {
	for {
		select {
		case b, ok := <-input:
			if !ok {
				w.Close()
				return
			}
			w.Write(b) // an error: the exec ended; keep draining
		case <-ctx.Done():
			w.CloseWithError(ctx.Err())
			return
		}
	}
}
