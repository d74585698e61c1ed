// Package agentclient is the host's typed client of the guest agent's API
// (package agentapi), over an agentconn.Session.
//
// Errors keep their class across the wire: the agent answers failures with a
// problem document carrying an errdefs code, and the client returns a
// *ProblemError that unwraps to the errdefs sentinel, so
// errdefs.IsNotFound(err) and errors.Is work. Transport failures (the VM or
// the connection is gone) are errdefs.ErrUnavailable; an ended ctx is
// errdefs.ErrCanceled or ErrDeadlineExceeded.
package agentclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Client calls one agent.
type Client struct {
	hc   *http.Client
	base string
	sess *agentconn.Session
	// Observe, if set, is told about every call: its method and agent path
	// ("GET /v1/files/stat", a fixed set), the time to the response header,
	// and its error.
	Observe func(op string, d time.Duration, err error)
	// Gone, if set, says why the agent cannot answer any more (its sandbox
	// was killed, or its VM exited), or nil while it can: a call that
	// loses the connection then fails with that reason.
	Gone func() error

	// featMu guards features, the agent's Info.Features once known.
	featMu   sync.Mutex
	features []string
}

// require fails with failed_precondition when the agent does not offer
// feature: it predates it (its sandbox was forked from a snapshot made by
// an older forkd). The agent is asked once per client.
func (c *Client) require(ctx context.Context, feature, what string) error {
	c.featMu.Lock()
	known := c.features
	c.featMu.Unlock()
	if known == nil {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		known = append([]string{}, info.Features...)
		c.featMu.Lock()
		c.features = known
		c.featMu.Unlock()
	}
	if !slices.Contains(known, feature) {
		return fmt.Errorf("%s: this sandbox's agent predates it (its snapshot was made by an older forkd): create the snapshot again: %w", what, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// New returns a client of the agent at the other end of s.
func New(s *agentconn.Session) *Client {
	return &Client{hc: s.HTTPClient(), base: agentconn.BaseURL, sess: s}
}

// NewHTTP returns a client that sends requests to baseURL with hc (tests,
// other transports).
func NewHTTP(hc *http.Client, baseURL string) *Client {
	return &Client{hc: hc, base: baseURL}
}

// ProblemError is a failure reported by the agent.
type ProblemError struct {
	Problem agentapi.Problem
	Op      string // "exec", "read file /x", ...
}

func (e *ProblemError) Error() string {
	return fmt.Sprintf("agent: %s: %s", e.Op, e.Problem.Detail)
}

// Unwrap returns the errdefs class of the problem.
func (e *ProblemError) Unwrap() error { return errdefs.FromCode(e.Problem.Code) }

// classForStatus classifies a response that carries no problem document
// (a proxy, an older agent).
func classForStatus(status int) string {
	switch {
	case status == http.StatusNotFound:
		return "not_found"
	case status == http.StatusConflict, status == http.StatusPreconditionFailed:
		return "failed_precondition"
	case status == http.StatusTooManyRequests:
		return "resource_exhausted"
	case status == http.StatusNotImplemented:
		return "not_implemented"
	case status == http.StatusServiceUnavailable, status == http.StatusBadGateway:
		return "unavailable"
	case status == http.StatusGatewayTimeout:
		return "deadline_exceeded"
	case status >= 400 && status < 500:
		return "invalid_argument"
	}
	return "internal"
}

func problemFrom(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBody))
	var p agentapi.Problem
	if json.Unmarshal(b, &p) != nil || p.Code == "" {
		p = agentapi.Problem{
			Title:  http.StatusText(resp.StatusCode),
			Status: resp.StatusCode,
			Detail: fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(b)),
			Code:   classForStatus(resp.StatusCode),
		}
	}
	return &ProblemError{Problem: p, Op: op}
}

// transportError classifies a failure to talk to the agent at all. When
// Gone says the agent is gone for good, that reason is the error: the
// connection's own (an unexpected EOF) tells a user nothing more.
func (c *Client) transportError(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("agent: %s: %v: %w", op, err, errdefs.ErrDeadlineExceeded)
	case ctx.Err() != nil:
		return fmt.Errorf("agent: %s: %v: %w", op, err, errdefs.ErrCanceled)
	}
	if c.Gone != nil {
		if gone := c.Gone(); gone != nil {
			return fmt.Errorf("%s: %w", op, gone)
		}
	}
	return fmt.Errorf("agent: %s: %v: %w", op, err, errdefs.ErrUnavailable)
}

// do sends a request and returns the response if it is a 2xx; otherwise
// the agent's problem as an error.
func (c *Client) do(ctx context.Context, op, method, path string, q url.Values, hdr http.Header, body io.Reader) (_ *http.Response, err error) {
	if c.Observe != nil {
		defer func(start time.Time) { c.Observe(method+" "+path, time.Since(start), err) }(time.Now())
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %v: %w", op, err, errdefs.ErrInvalidArgument)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, op, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, problemFrom(op, resp)
	}
	return resp, nil
}

// call sends in (JSON, if not nil) and decodes the response, at most limit
// bytes, into out (if not nil; a reply to drop is read up to maxReply).
func (c *Client) call(ctx context.Context, op, method, path string, q url.Values, limit int64, in, out any) error {
	var body io.Reader
	hdr := http.Header{}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("agent: %s: %v: %w", op, err, errdefs.ErrInvalidArgument)
		}
		body = bytes.NewReader(b)
		hdr.Set("Content-Type", "application/json")
	}
	resp, err := c.do(ctx, op, method, path, q, hdr, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return c.readError(ctx, op, discardLimited(resp.Body, maxReply, op))
	}
	if err := decodeLimited(resp.Body, limit, op, out); err != nil {
		return c.readError(ctx, op, fmt.Errorf("decoding the response: %w", err))
	}
	return nil
}

// Info describes the agent and its VM.
func (c *Client) Info(ctx context.Context) (agentapi.Info, error) {
	var info agentapi.Info
	err := c.call(ctx, "info", http.MethodGet, agentapi.PathInfo, nil, maxReply, nil, &info)
	return info, err
}

// SetIdentity re-applies an identity without a new session.
func (c *Client) SetIdentity(ctx context.Context, id agentapi.Identity) (agentapi.Info, error) {
	var info agentapi.Info
	err := c.call(ctx, "set identity", http.MethodPost, agentapi.PathIdentity, nil, maxReply, id, &info)
	return info, err
}

// Exec runs a process in the guest, streaming its output to stdout and
// stderr (nil discards) as it comes, and returns its exit event. stdin, if
// not nil, is streamed to the process's stdin (its EOF closes it) and
// req.Stdin is set accordingly.
//
// A process that ran returns its exit event with a nil error, whatever its
// exit code; check ExitCode, Signal and TimedOut. An error means no exit
// event was received: the request was refused (a *ProblemError, e.g.
// errdefs.ErrNotFound for a missing executable), or the stream was cut
// (errdefs.ErrUnavailable) — output written so far may be partial.
func (c *Client) Exec(ctx context.Context, req agentapi.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (agentapi.ExecEvent, error) {
	return c.ExecStarted(ctx, req, stdin, nil, stdout, stderr)
}

// ExecStarted is Exec that calls started (if not nil) once the process
// runs, before any output, with its guest pid (0 from an agent that
// predates process control): an error returned before that means the
// process never started (a missing executable, a bad cwd), and a proxy
// can still answer it with a plain error instead of an event stream.
// req.StdinOpen keeps stdin open after stdin's EOF, for WriteStdin.
func (c *Client) ExecStarted(ctx context.Context, req agentapi.ExecRequest, stdin io.Reader, started func(pid int), stdout, stderr io.Writer) (agentapi.ExecEvent, error) {
	if req.PTY != nil {
		if err := c.require(ctx, agentapi.FeaturePTY, "a terminal (pty)"); err != nil {
			return agentapi.ExecEvent{}, err
		}
	}
	req.Stdin = stdin != nil
	h, err := json.Marshal(req)
	if err != nil {
		return agentapi.ExecEvent{}, fmt.Errorf("agent: exec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	hdr := http.Header{}
	hdr.Set(agentapi.ExecHeader, string(h))
	var body io.Reader
	if stdin != nil {
		// Not the caller's reader itself: net/http would Close it if it
		// were a Closer.
		body = io.NopCloser(stdin)
		hdr.Set("Content-Type", "application/octet-stream")
	}
	resp, err := c.do(ctx, "exec", http.MethodPost, agentapi.PathExec, nil, hdr, body)
	if err != nil {
		return agentapi.ExecEvent{}, err
	}
	defer resp.Body.Close()
	if started != nil {
		pid, _ := strconv.Atoi(resp.Header.Get(agentapi.PidHeader))
		started(max(pid, 0))
	}
	dec := newEventDecoder(resp.Body, maxExecEvent, "exec")
	for {
		var ev agentapi.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			if err == io.EOF {
				err = errors.New("the stream ended without an exit event")
			}
			return agentapi.ExecEvent{}, c.readError(ctx, "exec", err)
		}
		var w io.Writer
		switch ev.Type {
		case agentapi.EventExit:
			return ev, nil
		case agentapi.EventStdout:
			w = stdout
		case agentapi.EventStderr:
			w = stderr
		default:
			continue // a newer agent's event type
		}
		if w != nil {
			if _, err := w.Write(ev.Data); err != nil {
				return agentapi.ExecEvent{}, fmt.Errorf("agent: exec: writing %s: %w", ev.Type, err)
			}
		}
	}
}

// Processes lists the running execs.
func (c *Client) Processes(ctx context.Context) ([]agentapi.ProcessInfo, error) {
	var out []agentapi.ProcessInfo
	err := c.call(ctx, "list processes", http.MethodGet, agentapi.PathProcesses, nil, maxReply, nil, &out)
	return out, err
}

// WriteStdin appends r to the stdin of the exec with guest pid pid (one
// started with ExecRequest.StdinOpen), then closes that stdin when
// closeStdin is set. It returns once the process's stdin pipe took every
// byte: a process that does not read blocks it (ctx bounds the wait).
// Errors: errdefs.ErrNotFound for a pid that is not a running exec,
// errdefs.ErrFailedPrecondition when its stdin is not kept open or is
// closed. Closing an already closed stdin with nothing to write succeeds.
func (c *Client) WriteStdin(ctx context.Context, pid int, r io.Reader, closeStdin bool) error {
	op := "write stdin of process " + strconv.Itoa(pid)
	var q url.Values
	if closeStdin {
		q = url.Values{"close": {"1"}}
	}
	var body io.Reader
	hdr := http.Header{}
	if r != nil {
		body = io.NopCloser(r) // net/http would Close a Closer
		hdr.Set("Content-Type", "application/octet-stream")
	}
	resp, err := c.do(ctx, op, http.MethodPost, agentapi.ProcessStdinPath(pid), q, hdr, body)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Signal sends sig ("SIGTERM"; "" is SIGKILL) to the process group of the
// exec with guest pid pid. errdefs.ErrNotFound: no such running exec.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	op := "signal process " + strconv.Itoa(pid)
	return c.call(ctx, op, http.MethodPost, agentapi.ProcessSignalPath(pid), nil, 0, agentapi.SignalRequest{Signal: sig}, nil)
}

// Resize sets the terminal size of the exec with guest pid pid (one
// started with ExecRequest.PTY). errdefs.ErrNotFound: no such running
// exec; errdefs.ErrFailedPrecondition: it has no terminal;
// errdefs.ErrInvalidArgument: a size outside 1..agentapi.MaxPTYSize.
func (c *Client) Resize(ctx context.Context, pid int, size agentapi.ResizeRequest) error {
	if err := c.require(ctx, agentapi.FeaturePTY, "resizing a terminal"); err != nil {
		return err
	}
	op := "resize the terminal of process " + strconv.Itoa(pid)
	return c.call(ctx, op, http.MethodPost, agentapi.ProcessResizePath(pid), nil, 0, size, nil)
}

// ReadFile streams the guest file at path to w and returns its size.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (int64, error) {
	op := "read file " + path
	resp, err := c.do(ctx, op, http.MethodGet, agentapi.PathFiles, url.Values{"path": {path}}, nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		// A cut stream surfaces here as an unexpected EOF (short of the
		// Content-Length, or a missing final chunk), never as success.
		return n, c.transportError(ctx, op, err)
	}
	return n, nil
}

// WriteFile writes r to the guest file at path with permission mode,
// atomically (readers see the old content or the new, whole). The parent
// directory must exist (errdefs.ErrNotFound otherwise).
func (c *Client) WriteFile(ctx context.Context, path string, mode fs.FileMode, r io.Reader) (agentapi.FileInfo, error) {
	op := "write file " + path
	perm := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		perm |= 0o1000
	}
	q := url.Values{"path": {path}, "mode": {"0" + strconv.FormatUint(uint64(perm), 8)}}
	hdr := http.Header{"Content-Type": {"application/octet-stream"}}
	resp, err := c.do(ctx, op, http.MethodPut, agentapi.PathFiles, q, hdr, io.NopCloser(r))
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi agentapi.FileInfo
	if err := decodeLimited(resp.Body, maxReply, op, &fi); err != nil {
		return fi, c.readError(ctx, op, err)
	}
	return fi, nil
}

// ListFiles lists a guest directory.
func (c *Client) ListFiles(ctx context.Context, path string) ([]agentapi.FileInfo, error) {
	var out []agentapi.FileInfo
	err := c.call(ctx, "list "+path, http.MethodGet, agentapi.PathFilesList, url.Values{"path": {path}}, maxListReply, nil, &out)
	return out, err
}

// Stat describes a guest path (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, path string) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	err := c.call(ctx, "stat "+path, http.MethodGet, agentapi.PathFilesStat, url.Values{"path": {path}}, maxReply, nil, &fi)
	return fi, err
}

// Mkdir creates a guest directory.
func (c *Client) Mkdir(ctx context.Context, req agentapi.MkdirRequest) (agentapi.FileInfo, error) {
	var fi agentapi.FileInfo
	err := c.call(ctx, "mkdir "+req.Path, http.MethodPost, agentapi.PathFilesMkdir, nil, maxReply, req, &fi)
	return fi, err
}

// Remove removes a guest path; a non-empty directory needs recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	return c.call(ctx, "remove "+path, http.MethodDelete, agentapi.PathFiles, q, 0, nil, nil)
}

// StartPython starts the persistent Python session and runs req.Warm in it.
// An exception in the warm-up code is reported in the response's
// Warm.Error, not as an error.
func (c *Client) StartPython(ctx context.Context, req agentapi.PythonStartRequest) (agentapi.PythonStartResponse, error) {
	var resp agentapi.PythonStartResponse
	err := c.call(ctx, "start python", http.MethodPost, agentapi.PathPythonStart, nil, maxRunCodeReply, req, &resp)
	return resp, err
}

// RunCode runs code in the persistent Python session. A Python exception
// or a timeout is part of the result (Error, TimedOut); an error means the
// code could not run (no session: errdefs.ErrFailedPrecondition).
func (c *Client) RunCode(ctx context.Context, req agentapi.RunCodeRequest) (agentapi.RunCodeResult, error) {
	var res agentapi.RunCodeResult
	err := c.call(ctx, "run code", http.MethodPost, agentapi.PathRunCode, nil, maxRunCodeReply, req, &res)
	return res, err
}

// Rehearse runs code in a throwaway copy of the persistent Python session
// (agentapi.RehearseRequest); the session itself is left as it was. An
// agent older than the call answers errdefs.ErrNotFound.
func (c *Client) Rehearse(ctx context.Context, req agentapi.RehearseRequest) error {
	var out struct{}
	return c.call(ctx, "rehearse", http.MethodPost, agentapi.PathRehearse, nil, 4<<10, req, &out)
}

// RunCodeStream runs code in the persistent Python session as RunCode
// does, writing its output to stdout and stderr (nil discards) as it
// appears. The result's Stdout and Stderr are empty: the output went to
// the writers. As with RunCode, a Python exception or a timeout is part of
// the result. An error means no result was received: the request was
// refused (a *ProblemError, e.g. errdefs.ErrFailedPrecondition without a
// session), the code could not run to its end (the agent's error event,
// also a *ProblemError: the session died), a writer failed (the code is
// then interrupted), or the stream was cut (errdefs.ErrUnavailable);
// output written so far may be partial, and a cut stream is never taken
// for a result.
func (c *Client) RunCodeStream(ctx context.Context, req agentapi.RunCodeRequest, stdout, stderr io.Writer) (agentapi.RunCodeResult, error) {
	const op = "run code"
	b, err := json.Marshal(req)
	if err != nil {
		return agentapi.RunCodeResult{}, fmt.Errorf("agent: %s: %v: %w", op, err, errdefs.ErrInvalidArgument)
	}
	hdr := http.Header{"Content-Type": {"application/json"}}
	resp, err := c.do(ctx, op, http.MethodPost, agentapi.PathRunCodeStream, nil, hdr, bytes.NewReader(b))
	if err != nil {
		return agentapi.RunCodeResult{}, err
	}
	// Closing the body early (a writer failed, ctx ended) ends the
	// request: the agent interrupts the code.
	defer resp.Body.Close()
	// An event carries at most a chunk of output, or the result (a value,
	// figures): limited as a whole RunCode result is.
	dec := newEventDecoder(resp.Body, maxRunCodeReply, op)
	for {
		var ev agentapi.RunCodeEvent
		if err := dec.Decode(&ev); err != nil {
			if err == io.EOF {
				err = errors.New("the stream ended without a result event")
			}
			return agentapi.RunCodeResult{}, c.readError(ctx, op, err)
		}
		var w io.Writer
		switch ev.Type {
		case agentapi.EventResult:
			if ev.Result == nil {
				return agentapi.RunCodeResult{}, c.transportError(ctx, op, errors.New("a result event without a result"))
			}
			return *ev.Result, nil
		case agentapi.EventError:
			p := agentapi.Problem{Title: "Internal Server Error", Status: http.StatusInternalServerError, Detail: "an error event without a problem", Code: "internal"}
			if ev.Error != nil {
				p = *ev.Error
			}
			return agentapi.RunCodeResult{}, &ProblemError{Problem: p, Op: op}
		case agentapi.EventStdout:
			w = stdout
		case agentapi.EventStderr:
			w = stderr
		default:
			continue // a newer agent's event type
		}
		if w != nil && ev.Data != "" {
			if _, err := io.WriteString(w, ev.Data); err != nil {
				return agentapi.RunCodeResult{}, fmt.Errorf("agent: %s: writing %s: %w", op, ev.Type, err)
			}
		}
	}
}

// Quiesce asks the agent to end the session and wait for a new HELLO, as
// before a snapshot. The connection is left open on purpose: a VM snapshotted
// while its host is connected restores into children whose host is connected
// too, so the guest's virtio-serial port state matches and no port-open
// event races the new session. The caller closes the Session (and with it
// the connection) after the snapshot; no further requests can succeed.
func (c *Client) Quiesce(ctx context.Context) error {
	err := c.call(ctx, "quiesce", http.MethodPost, agentapi.PathQuiesce, nil, 0, nil, nil)
	if err == nil && c.sess != nil {
		// The agent refuses requests on streams of this session now; drop
		// the idle ones so a stray later call fails fast (GoAway) rather
		// than waiting for an answer that cannot come.
		c.sess.CloseIdleConnections()
	}
	return err
}

// Shutdown asks the agent to power the VM off. It returns once the agent
// has acknowledged; the VMM process exits shortly after.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.call(ctx, "shutdown", http.MethodPost, agentapi.PathShutdown, nil, 0, nil, nil)
}

// Changes streams what the guest changed in its root file system, as an
// uncompressed OCI layer tar, to w, and returns its size. The guest
// decides the size, so the stream is cut at limit bytes with a
// ResourceExhausted error; a stream the agent aborted (it could not read
// an entry) is an error, never a short archive.
func (c *Client) Changes(ctx context.Context, w io.Writer, limit int64) (int64, error) {
	const op = "export changes"
	resp, err := c.do(ctx, op, http.MethodGet, agentapi.PathChanges, nil, nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return n, c.transportError(ctx, op, err)
	}
	if n > limit {
		return n, fmt.Errorf("%s: the guest's changes are larger than the limit of %d bytes: %w", op, limit, errdefs.ErrResourceExhausted)
	}
	return n, nil
}
