package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	forkdmcp "github.com/forkd-dev/forkd/internal/mcp"
)

// MCP over HTTP (/mcp).
//
// The daemon serves forkd's MCP tools (internal/mcp) with the streamable
// HTTP transport, stateless: each POST carries a complete JSON-RPC exchange.
// /mcp is an ordinary route of the API's mux, so it sits behind the same
// middleware as every other route: a TCP request without a valid bearer
// token is refused with 401 before any MCP processing, a Unix-socket
// request passes as the socket's 0600 mode allows, and the POST is counted
// in the request metrics and recorded in the audit log (action "POST /mcp").
//
// Tool calls do not reach the engine directly. The tools' backend is the
// API client (internal/client) over an in-process transport, mcpTransport,
// which serves each REST request with the API's own handler (a second
// instance of Handler(): request id, metrics, auth, audit, routes). So a
// tool call is exactly the REST call it makes, checked and recorded as
// such: "run_command" is a POST /v1/sandboxes/{id}/exec with the caller's
// identity, refused if the token was revoked meanwhile, authorized by the
// token's role and tenant as that route is (authorize.go: another tenant's
// sandbox is not found, a read-only token may not exec), and audited with
// the token name and tenant (or socket peer), the route as action and the
// sandbox as target.
//
// The identity travels in the context. The /mcp handler captures, from the
// authenticated request, its Authorization header, the local address it
// arrived on (a *net.UnixAddr for the socket, which is what auth.Middleware
// accepts without a token), its peer (uid/pid from SO_PEERCRED, or the TCP
// address) and its request id, and puts them in the request's context.
// Because the MCP handler is stateless, each tool runs in a context derived
// from the HTTP request that carried the call, and the client's requests
// inherit it; mcpTransport reads the identity from there and builds the
// inner request from it alone (a fresh context holding only the peer and
// local address, the original Authorization header, the /mcp request's id
// as X-Request-Id so audit records of one call share it). Headers the MCP
// client sent are not forwarded. A request without a captured identity is
// refused, so the transport cannot be used to skip authentication.
//
// So the audit log holds, per MCP POST, one "POST /mcp" record (the
// exchange: initialize, tools/list, tools/call ...) and, for a tool call
// that changes something, the record of each REST call it made (reads are
// not audited, as in REST), all under the same request id. The request
// metrics count the inner calls under their REST routes too.
//
// Every other method, GET and DELETE included, answers 405 with Allow: POST
// (no stream, no session), and the SDK's own plain-text refusals become
// problem+json (problemWriter).
func (s *Server) mountMCP(mux *http.ServeMux) {
	h := s.mcpHandler()
	mux.Handle("POST /mcp", h)
	mux.Handle("GET /mcp", h)
	mux.Handle("DELETE /mcp", h)
	// Any other method reaches h too, which answers 405 with Allow: POST
	// (the mux's own 405 would list GET and DELETE as allowed).
	mux.Handle("/mcp", h)
}

type mcpCallerKey struct{}

// mcpCaller is the identity of an /mcp request, handed to the REST calls
// its tools make.
type mcpCaller struct {
	authorization string   // the request's Authorization header, re-verified by each inner request
	actFor        string   // the tenant an admin acts for (auth.ActForHeader), sent on with each inner request
	localAddr     net.Addr // where the request arrived (http.LocalAddrContextKey)
	peer          string   // who sent it (PeerContext), for the audit log
	remoteAddr    string
	requestID     string
}

// mcpHandler answers /mcp. The MCP server and the inner API handler are
// built on the first request, so building Handler() stays cheap (and the
// inner Handler() builds no MCP server of its own until something posts to
// its /mcp, which the tools never do).
func (s *Server) mcpHandler() http.Handler {
	var (
		once sync.Once
		mcpH http.Handler
	)
	build := func() {
		api := sync.OnceValue(s.Handler)
		b := client.NewWithTransport("http://forkd", &mcpTransport{api: api})
		// The SDK logs every stateless exchange at info level; the daemon's
		// log keeps its warnings and errors only.
		var log *slog.Logger
		if s.Log != nil {
			log = slog.New(minLevel{s.Log.Handler(), slog.LevelWarn})
		}
		mcpH = forkdmcp.NewHTTPHandler(forkdmcp.NewServer(b, forkdmcp.Options{Version: s.Version, Logger: log}), log)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			// Stateless: no server-to-client stream (GET) and no session to
			// end (DELETE). The MCP spec asks for 405 here.
			w.Header().Set("Allow", http.MethodPost)
			writeProblem(w, r, withStatus(http.StatusMethodNotAllowed,
				fmt.Errorf("%s /mcp: this MCP endpoint is stateless; send JSON-RPC messages with POST: %w", r.Method, errdefs.ErrInvalidArgument)))
			return
		}
		once.Do(build)
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		var actFor string
		if p, ok := s.principal(r); ok && p.Operator != "" { // actFor consumed the header
			actFor = p.Tenant
		}
		c := mcpCaller{
			authorization: r.Header.Get("Authorization"), actFor: actFor, localAddr: local,
			peer: peerOf(r), remoteAddr: r.RemoteAddr, requestID: requestID(r),
		}
		pw := &problemWriter{ResponseWriter: w, r: r}
		mcpH.ServeHTTP(pw, r.WithContext(context.WithValue(r.Context(), mcpCallerKey{}, c)))
		pw.finish()
	})
}

// problemWriter turns the MCP SDK's plain-text HTTP errors (wrong content
// type or Accept header, body over 4 MiB, a loopback listener reached with
// a foreign Host header) into problem+json, as every other API error is.
// JSON-RPC answers, errors included, pass unchanged.
type problemWriter struct {
	http.ResponseWriter
	r      *http.Request
	status int // of the plain-text error being converted; 0: passing through
	msg    bytes.Buffer
}

func (w *problemWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *problemWriter) Write(p []byte) (int, error) {
	if w.status != 0 {
		return w.msg.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

func (w *problemWriter) FlushError() error {
	if w.status != 0 {
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *problemWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *problemWriter) finish() {
	if w.status == 0 {
		return
	}
	w.Header().Del("X-Content-Type-Options")
	class := errdefs.ErrInvalidArgument
	if w.status >= 500 {
		class = errdefs.ErrInternal
	}
	writeProblem(w.ResponseWriter, w.r, withStatus(w.status, fmt.Errorf("MCP: %s: %w", strings.TrimSpace(w.msg.String()), class)))
}

// minLevel drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}
func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}
func (h minLevel) WithGroup(n string) slog.Handler { return minLevel{h.Handler.WithGroup(n), h.min} }

// mcpTransport is an http.RoundTripper that serves client requests with
// the API handler in-process, as the /mcp caller in the request's context
// (see mountMCP). Responses stream: RoundTrip returns when the handler
// sends its header, and the body is read while the handler writes it.
type mcpTransport struct {
	api func() http.Handler
}

// errNoCaller refuses an in-process request that does not come from an
// /mcp request.
var errNoCaller = fmt.Errorf("in-process API request without the identity of an /mcp request: %w", errdefs.ErrUnauthenticated)

func (t *mcpTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, ok := req.Context().Value(mcpCallerKey{}).(mcpCaller)
	if !ok {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errNoCaller
	}

	// A fresh context: the inner request carries the caller's identity and
	// the tool call's cancellation, nothing else of the /mcp request (its
	// audit note, token name and request id belong to that request).
	ctx, cancel := context.WithCancel(context.Background())
	stopAfter := context.AfterFunc(req.Context(), cancel)
	if c.localAddr != nil {
		ctx = context.WithValue(ctx, http.LocalAddrContextKey, c.localAddr)
	}
	ctx = context.WithValue(ctx, peerKey{}, c.peer)

	in := req.Clone(ctx)
	in.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	in.RequestURI = in.URL.RequestURI()
	in.Host = req.URL.Host
	in.RemoteAddr = c.remoteAddr
	in.Proto, in.ProtoMajor, in.ProtoMinor = "HTTP/1.1", 1, 1
	in.Header.Del("Authorization")
	in.Header.Del(auth.ActForHeader)
	if c.actFor != "" {
		in.Header.Set(auth.ActForHeader, c.actFor)
	}
	if c.authorization != "" {
		in.Header.Set("Authorization", c.authorization)
	}
	if c.requestID != "" {
		in.Header.Set("X-Request-Id", c.requestID)
	}
	if in.Body == nil {
		in.Body = http.NoBody
	}

	pr, pw := io.Pipe()
	w := &pipeResponseWriter{
		header: http.Header{}, pw: pw, req: req, done: make(chan roundTripResult, 1),
		body: &pipeBody{PipeReader: pr, cancel: cancel},
	}
	go func() {
		defer stopAfter()
		// The handler is done with the request: end its context, which
		// also releases the sandbox it held busy (Engine.AgentFor).
		defer cancel()
		defer in.Body.Close()
		defer func() {
			if p := recover(); p != nil {
				// http.ErrAbortHandler (a failure mid-stream) or a bug: the
				// client must not take a partial answer for a whole one.
				err := fmt.Errorf("API handler aborted %s %s: %v", in.Method, in.URL.Path, p)
				if !w.sent {
					w.done <- roundTripResult{err: err}
				}
				pw.CloseWithError(err)
				cancel()
				return
			}
			w.WriteHeader(http.StatusOK) // no-op when a header was sent
			pw.Close()
		}()
		t.api().ServeHTTP(w, in)
	}()
	select {
	case res := <-w.done:
		if res.err != nil {
			cancel()
		}
		return res.resp, res.err
	case <-req.Context().Done():
		cancel()
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
}

type roundTripResult struct {
	resp *http.Response
	err  error
}

// pipeResponseWriter is the handler's side of an in-process exchange.
// Only the handler's goroutine uses it.
type pipeResponseWriter struct {
	header http.Header
	pw     *io.PipeWriter
	body   *pipeBody
	req    *http.Request
	sent   bool
	done   chan roundTripResult
}

func (w *pipeResponseWriter) Header() http.Header { return w.header }

func (w *pipeResponseWriter) WriteHeader(code int) {
	if w.sent || code < 200 {
		return
	}
	w.sent = true
	h := w.header.Clone()
	length := int64(-1)
	if cl, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64); err == nil {
		length = cl
	}
	w.done <- roundTripResult{resp: &http.Response{
		Status: strconv.Itoa(code) + " " + http.StatusText(code), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: w.body, ContentLength: length, Request: w.req,
	}}
}

func (w *pipeResponseWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(p)
}

// FlushError makes http.ResponseController.Flush work: writes already go
// straight to the reader.
func (w *pipeResponseWriter) FlushError() error { return nil }

// Flush implements http.Flusher.
func (w *pipeResponseWriter) Flush() {}

// pipeBody is the client's side: closing it early ends the handler's
// request (its context is cancelled and its writes fail).
type pipeBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *pipeBody) Close() error {
	b.cancel()
	return b.PipeReader.CloseWithError(errBodyClosed)
}

var errBodyClosed = errors.New("in-process response body closed by the client")
