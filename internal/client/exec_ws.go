package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Resize sets the terminal size of a running exec started with a pty.
func (c *Client) Resize(ctx context.Context, id string, pid int, size apiv1.ResizeRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid)+"/resize", nil, size, nil)
}

// ExecSession is a process run over the exec WebSocket: its input stays
// open until CloseStdin, and it can be resized and signalled. Write,
// CloseStdin, Resize and Signal may be called while Wait runs.
type ExecSession struct {
	// Pid is the process's guest pid.
	Pid  int
	conn *websocket.Conn
	// OnError, if set before Wait, receives the problems the daemon
	// answers to control messages (a refused resize); the process runs on.
	OnError func(*Error)

	mu     sync.Mutex // guards closed
	closed bool       // CloseStdin was sent
}

// ExecSession starts req in sandbox id over the exec WebSocket and returns
// once the process runs. A process that cannot start (no such sandbox or
// executable, a bad request) is an *Error, as from Exec. ctx bounds the
// whole session: when it ends, the connection closes and the daemon kills
// the process group.
func (c *Client) ExecSession(ctx context.Context, id string, req apiv1.ExecRequest) (*ExecSession, error) {
	hdr := http.Header{}
	if c.token != "" {
		hdr.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, c.url("/v1/sandboxes/"+url.PathEscape(id)+"/exec/ws", nil), &websocket.DialOptions{
		HTTPClient: c.http, HTTPHeader: hdr, Subprotocols: []string{apiv1.ExecWSProtocol},
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			return nil, decodeProblem(resp)
		}
		if resp != nil {
			return nil, fmt.Errorf("forkd daemon at %s: the exec WebSocket answered %s (a daemon without it?): %w", c.socket, resp.Status, errdefs.ErrUnavailable)
		}
		return nil, c.connectError(err)
	}
	// Output messages may be large (the daemon's chunks); input is bounded
	// by the daemon.
	conn.SetReadLimit(4 << 20)
	fail := func(err error) (*ExecSession, error) {
		conn.CloseNow()
		return nil, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fail(err)
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fail(fmt.Errorf("sending the exec request: %w", err))
	}
	typ, data, err := conn.Read(ctx)
	if err != nil {
		return fail(fmt.Errorf("exec WebSocket closed before the process started: %v: %w", err, errdefs.ErrUnavailable))
	}
	msg, err := parseServerMessage(typ, data)
	if err != nil {
		return fail(err)
	}
	switch msg.Type {
	case apiv1.ExecWSTypeStart:
		return &ExecSession{Pid: msg.Pid, conn: conn}, nil
	case apiv1.ExecWSTypeError:
		return fail(msg.problem())
	}
	return fail(fmt.Errorf("exec WebSocket: first message %q, want start or error: %w", msg.Type, errdefs.ErrInternal))
}

// serverMessage is any text message of the daemon.
type serverMessage struct {
	apiv1.ExecWSExit
	Pid int `json:"pid"`
	// Error is a string in an exit message, a Problem in an error message.
	Error json.RawMessage `json:"error"`
}

func parseServerMessage(typ websocket.MessageType, data []byte) (serverMessage, error) {
	var m serverMessage
	if typ != websocket.MessageText {
		return m, fmt.Errorf("exec WebSocket: a binary message where a text one was due: %w", errdefs.ErrInternal)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("exec WebSocket: bad message %q: %v: %w", clip(data), err, errdefs.ErrInternal)
	}
	return m, nil
}

func (m serverMessage) problem() *Error {
	var p apiv1.Problem
	if err := json.Unmarshal(m.Error, &p); err != nil || p.Detail == "" {
		p = apiv1.Problem{Code: "internal", Detail: "exec WebSocket: an error message without a problem: " + string(m.Error)}
	}
	return &Error{p}
}

func clip(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// Write sends p to the process's stdin (a terminal's keyboard).
func (s *ExecSession) Write(p []byte) (int, error) {
	for off := 0; off < len(p); {
		n := min(len(p)-off, 32<<10) // under the daemon's 64 KiB read limit
		msg := make([]byte, 1+n)
		msg[0] = apiv1.ExecWSStdin
		copy(msg[1:], p[off:off+n])
		if err := s.conn.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
			return off, err
		}
		off += n
	}
	return len(p), nil
}

// CloseStdin ends the input: stdin closes, or a terminal gets ^D. Once.
func (s *ExecSession) CloseStdin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.control(apiv1.ExecWSControl{Type: apiv1.ExecWSTypeCloseStdin})
}

// Resize sets the terminal's size (a refusal arrives at OnError).
func (s *ExecSession) Resize(rows, cols int) error {
	return s.control(apiv1.ExecWSControl{Type: apiv1.ExecWSTypeResize, Rows: rows, Cols: cols})
}

// Signal sends sig ("SIGINT"; "" is SIGKILL) to the process group.
func (s *ExecSession) Signal(sig string) error {
	return s.control(apiv1.ExecWSControl{Type: apiv1.ExecWSTypeSignal, Signal: sig})
}

func (s *ExecSession) control(c apiv1.ExecWSControl) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return s.conn.Write(context.Background(), websocket.MessageText, b)
}

// Wait copies the process's output to stdout and stderr until it exits,
// and returns the exit. A session cut before the exit is an error
// (errdefs.ErrUnavailable). A failure the daemon reports in the exit
// (ExitCode -1 with Error) is returned as an *Error too.
func (s *ExecSession) Wait(ctx context.Context, stdout, stderr io.Writer) (apiv1.ExecWSExit, error) {
	for {
		typ, data, err := s.conn.Read(ctx)
		if err != nil {
			return apiv1.ExecWSExit{}, fmt.Errorf("exec WebSocket cut before the process exited: %v: %w", err, errdefs.ErrUnavailable)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				continue
			}
			w := stdout
			if data[0] == apiv1.ExecWSStderr {
				w = stderr
			}
			if _, err := w.Write(data[1:]); err != nil {
				return apiv1.ExecWSExit{}, fmt.Errorf("writing the process's output: %w", err)
			}
			continue
		}
		msg, err := parseServerMessage(typ, data)
		if err != nil {
			return apiv1.ExecWSExit{}, err
		}
		switch msg.Type {
		case apiv1.ExecWSTypeError:
			if s.OnError != nil {
				s.OnError(msg.problem())
			}
		case apiv1.ExecWSTypeExit:
			exit := msg.ExecWSExit
			json.Unmarshal(msg.Error, &exit.Error)
			s.conn.Close(websocket.StatusNormalClosure, "")
			if exit.Error != "" && exit.ExitCode == -1 {
				return exit, &Error{apiv1.Problem{Detail: exit.Error, Code: exit.Code}}
			}
			return exit, nil
		}
	}
}

// Close ends the session at once; a process still running is killed.
func (s *ExecSession) Close() error {
	err := s.conn.CloseNow()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
