package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Audit actions the API layer records besides requests.
const (
	// ActionAuditResumed is the first record written after audit writes
	// failed: its Detail says since when, how many writes failed and how
	// many requests were refused meanwhile (none of which ran).
	ActionAuditResumed = "audit.resumed"
	// ActionOperationFinished records a long-running operation (an image
	// build) ending, after the request that started it was answered.
	ActionOperationFinished = "operation.finished"
)

// outcomeUnauthenticated is the outcome of a request refused by auth.
const outcomeUnauthenticated = "unauthenticated"

// auditNote is what a handler adds to its request's audit record: the ids
// it created or touched beyond those in the path, and the error it
// answered with; and what the layers inside auth learnt: the token's name
// and tenant, and whether the request was refused because the log cannot
// be written.
type auditNote struct {
	mu      sync.Mutex
	targets []string
	err     error
	token   string
	tenant  string
	passed  bool // got past auth
	refused bool // refused by the audit gate: its failure is already counted
}

type auditKey struct{}

// passedAs records that the request got past authentication as p.
func (n *auditNote) passedAs(p auth.Principal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.token, n.tenant, n.passed = p.Token, auth.TenantOf(p.Tenant), true
}

// noteTargets adds ids to the request's audit record (e.g. the sandboxes a
// fork created).
func noteTargets(r *http.Request, ids ...string) {
	if n, _ := r.Context().Value(auditKey{}).(*auditNote); n != nil {
		n.mu.Lock()
		n.targets = append(n.targets, ids...)
		n.mu.Unlock()
	}
}

func noteError(r *http.Request, err error) {
	if n, _ := r.Context().Value(auditKey{}).(*auditNote); n != nil {
		n.mu.Lock()
		n.err = err
		n.mu.Unlock()
	}
}

// mutating reports whether a method changes state: those requests are
// audited, reads are not.
func mutating(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// auditRequests records one hash-chained audit record per mutating
// request (and per exec WebSocket, a GET that runs a process), after it is answered (or its handler panicked): who (token name, peer), what (the route as
// action, path ids and created ids as targets), the outcome and how long it
// took. It wraps auth (the Handler chain is auditRequests, auth,
// auditAdmit, routes), so requests auth refuses are recorded too, with the
// outcome "unauthenticated" and no token name: probing with bad tokens
// leaves a trace.
func (s *Server) auditRequests(mux *http.ServeMux, next http.Handler) http.Handler {
	if s.Audit == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := mux.Handler(r)
		if (!mutating(r.Method) && pattern != execWSPattern) || strings.HasPrefix(pattern, portProxyPrefix) {
			// Reads, and an app's own traffic through the port proxy.
			next.ServeHTTP(w, r)
			return
		}
		note := &auditNote{}
		r = r.WithContext(context.WithValue(r.Context(), auditKey{}, note))
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		completed := false
		// Deferred, so a handler that panics (a bug, or http.ErrAbortHandler
		// mid-stream) is still recorded before the panic goes on: it may
		// have changed something already.
		defer func() {
			var panicked any
			if !completed {
				panicked = recover()
			}
			s.auditRequest(r, sw.status, pattern, note, panicked, time.Since(start))
			if panicked != nil {
				panic(panicked)
			}
		}()
		next.ServeHTTP(sw, r)
		completed = true
	})
}

// auditRequest writes the record of one mutating request that was
// answered with status (0: nothing sent) after routing by pattern.
// panicked is what its handler panicked with, if it did.
func (s *Server) auditRequest(r *http.Request, status int, pattern string, note *auditNote, panicked any, took time.Duration) {
	note.mu.Lock()
	noted := note.targets
	err, token, tenant, passed, refused := note.err, note.token, note.tenant, note.passed, note.refused
	note.mu.Unlock()
	if refused {
		return // not run; the gate counted the failure and the next write records the gap
	}
	if panicked != nil {
		err = fmt.Errorf("the handler panicked (%v) after it may have acted: %w", panicked, errdefs.ErrInternal)
	}
	outcome, msg := audit.OutcomeOf(err)
	switch {
	case !passed && (status == http.StatusUnauthorized || status == http.StatusForbidden):
		if !s.unauthAudit.admit() {
			return // counted; the next record written says how many
		}
		outcome, msg = outcomeUnauthenticated, fmt.Sprintf("refused by authentication (HTTP %d)", status)
	case err == nil && status >= 300 && status < 400:
		// ServeMux's own redirect to the clean path ("/v1/sandboxes/a/../b"):
		// no route ran, so the record names the path asked for, not the
		// route (and targets) it was redirected to.
		outcome, pattern = "http_"+strconv.Itoa(status), ""
	case err == nil && status >= 400:
		outcome = "http_" + strconv.Itoa(status)
	}
	var targets []string
	if pattern == "" || pattern == "/" { // no route ran: the catch-all answered, or the mux redirected
		pattern = r.Method + " " + r.URL.Path
	} else {
		targets = pathTargets(pattern, r.URL.EscapedPath())
	}
	targets = uniq(append(targets, noted...))
	// What the client chose (the path, ids in it, error messages that
	// quote them) is bounded, so that no request can make its record too
	// long to write: the log would refuse it, the request would go
	// unrecorded and the gate would close.
	for i, t := range targets {
		targets[i] = clip(t, maxAuditTarget)
	}
	if n := s.unauthAudit.takeSkipped(); n > 0 {
		s.appendAudit(audit.Record{
			RequestID: requestID(r), Action: actionUnauthNotRecorded, Outcome: outcomeUnauthenticated,
			Error: fmt.Sprintf("%d requests refused by authentication were not recorded one by one: more than %d a second (bursts of %d)",
				n, unauthAuditRate, unauthAuditBurst),
		})
	}
	s.appendAudit(audit.Record{
		RequestID: requestID(r), Token: token, Tenant: tenant, Peer: clip(peerOf(r), maxAuditTarget),
		Action: clip(pattern, maxAuditAction), Targets: targets, Outcome: outcome, Error: clip(msg, maxAuditError),
		DurationMillis: float64(took.Microseconds()) / 1000,
	})
}

// Requests refused by authentication are recorded one by one up to a
// rate: anyone who can reach a TCP listener can send them, and without a
// bound they could fill the disk with audit records. Beyond it they are
// counted, and the next record written is preceded by one that says how
// many went unrecorded (actionUnauthNotRecorded).
const (
	unauthAuditRate  = 20  // records a second, sustained
	unauthAuditBurst = 200 // records at once

	actionUnauthNotRecorded = "audit.unauthenticated_not_recorded"
)

// unauthLimiter bounds the audit records of unauthenticated requests.
type unauthLimiter struct {
	once    sync.Once
	lim     *rate.Limiter
	skipped atomic.Int64
}

// admit reports whether an unauthenticated request gets its own record,
// counting it otherwise.
func (u *unauthLimiter) admit() bool {
	u.once.Do(func() { u.lim = rate.NewLimiter(unauthAuditRate, unauthAuditBurst) })
	if u.lim.Allow() {
		return true
	}
	u.skipped.Add(1)
	return false
}

// takeSkipped returns and resets the count of unrecorded requests.
func (u *unauthLimiter) takeSkipped() int64 { return u.skipped.Swap(0) }

// Bounds on the client-controlled text of a request's audit record, in
// bytes (JSON escaping can make each up to 6 times longer in the line, all
// of it still far below audit.MaxLineBytes).
const (
	maxAuditAction = 512  // "METHOD /path" of a request no route took
	maxAuditTarget = 256  // one id from the path
	maxAuditError  = 4096 // the error answered
)

// clip cuts s to at most n bytes (at a UTF-8 boundary) and says how long
// it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("...(%d bytes)", len(s))
}

// auditAdmit runs inside auth: it notes the token's name and tenant for
// the record auditRequests writes, and fails closed: while audit writes fail, a
// mutating request is refused with 503 unless a write succeeds now (see
// auditGate).
func (s *Server) auditAdmit(next http.Handler) http.Handler {
	if s.Audit == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note, _ := r.Context().Value(auditKey{}).(*auditNote)
		if note == nil { // not mutating
			next.ServeHTTP(w, r)
			return
		}
		p, _ := s.principal(r)
		note.passedAs(p)
		if err := s.auditWritable(r); err != nil {
			note.mu.Lock()
			note.refused = true
			note.mu.Unlock()
			writeProblem(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// auditGate makes the service fail closed on audit writes. After a write
// fails, mutating requests are refused (503) until a write succeeds again:
// each refused request first retries, by writing the ActionAuditResumed
// record that documents the gap; when that works, the request runs. The
// log itself stays sticky after a failure that may have left a partial
// record (see audit.Log.Append): then only a restart helps, and the 503
// says so.
type auditGate struct {
	failing atomic.Bool // fast path: false while writes succeed

	// mu guards the fields below; it serialises retries.
	mu       sync.Mutex
	since    time.Time // first failure of this run of failures
	failures int       // writes failed since
	refused  int       // requests refused since
	last     error     // the latest failure
}

// appendAudit writes rec, retrying first (with the ActionAuditResumed
// record) while the log is failing. A failure is logged, counted
// (forkd_audit_write_failures_total) and closes the gate.
func (s *Server) appendAudit(rec audit.Record) error {
	g := &s.auditGate
	if g.failing.Load() {
		g.mu.Lock()
		err := s.resumeAuditLocked(rec.RequestID, auth.Principal{Token: rec.Token, Tenant: rec.Tenant}, rec.Peer)
		g.mu.Unlock()
		if err != nil {
			if s.Log != nil {
				s.Log.Error("audit log still failing: record not written", "action", rec.Action, "request_id", rec.RequestID, "err", err)
			}
			return err
		}
	}
	if _, err := s.Audit.Append(rec); err != nil {
		g.mu.Lock()
		s.auditFailedLocked(err)
		g.mu.Unlock()
		if s.Log != nil {
			s.Log.Error("audit log append failed: mutating requests are refused until a record can be written",
				"action", rec.Action, "request_id", rec.RequestID, "err", err)
		}
		return err
	}
	return nil
}

// auditWritable returns nil when the log takes records, retrying once
// while it is failing; otherwise the 503 error for r.
func (s *Server) auditWritable(r *http.Request) error {
	g := &s.auditGate
	if !g.failing.Load() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p, _ := s.principal(r)
	err := s.resumeAuditLocked(requestID(r), p, peerOf(r))
	if err == nil {
		return nil
	}
	g.refused++
	return fmt.Errorf("the audit log %s cannot be written (%v; failing since %s, %d failed writes, %d requests refused): "+
		"forkd refuses requests that change anything until a record can be written again, and every new request retries. "+
		"Fix the cause (disk space, permissions, the state file holding the log's anchor; see the daemon's log), or restart the daemon if the error says so: %w",
		s.Audit.Dir(), g.last, g.since.UTC().Format(time.RFC3339), g.failures, g.refused, errdefs.ErrUnavailable)
}

// resumeAuditLocked, while the gate is closed, writes the record that ends
// the gap; the caller holds g.mu. nil when the log takes records again.
func (s *Server) resumeAuditLocked(requestID string, who auth.Principal, peer string) error {
	g := &s.auditGate
	if !g.failing.Load() {
		return nil // another request resumed meanwhile
	}
	_, err := s.Audit.Append(audit.Record{
		RequestID: requestID, Token: who.Token, Tenant: who.Tenant, Peer: peer, Action: ActionAuditResumed, Outcome: audit.OutcomeOK,
		Detail: map[string]any{
			"failing_since": g.since.UTC(), "write_failures": g.failures, "requests_refused": g.refused, "last_error": g.last.Error(),
		},
	})
	if err != nil {
		s.auditFailedLocked(err)
		return err
	}
	if s.Log != nil {
		s.Log.Info("audit log writable again", "failed_writes", g.failures, "requests_refused", g.refused)
	}
	g.since, g.failures, g.refused, g.last = time.Time{}, 0, 0, nil
	g.failing.Store(false)
	return nil
}

// auditFailedLocked counts a failed write and closes the gate; the caller
// holds g.mu.
func (s *Server) auditFailedLocked(err error) {
	g := &s.auditGate
	if !g.failing.Load() {
		g.since, g.failures, g.refused = time.Now(), 0, 0
	}
	g.failures++
	g.last = err
	g.failing.Store(true)
	s.Metrics.ObserveAuditWriteFailure()
}

// RecordEvent writes a lifecycle record: something the daemon decided or
// finished on its own, not answering a request (a sandbox died or expired,
// a background branch committed). err is the failure it reports, if any.
// It goes through the same gate as requests: a failed write refuses
// mutating requests until a write succeeds. A Server without an audit log
// records nothing.
func (s *Server) RecordEvent(action string, targets []string, err error, detail map[string]any) {
	if s.Audit == nil {
		return
	}
	outcome, msg := audit.OutcomeOf(err)
	s.appendAudit(audit.Record{Action: action, Targets: targets, Outcome: outcome, Error: msg, Detail: detail})
}

// auditOperationFinished records an operation that ended (ActionOperationFinished),
// with its id, target and result digest (for an image build) as targets.
func (s *Server) auditOperationFinished(id string) {
	op, ok := s.ops.get(id)
	if !ok || op.State == apiv1.OpRunning {
		return
	}
	targets := []string{op.ID}
	if op.Target != "" {
		targets = append(targets, op.Target)
	}
	var res struct {
		Digest string `json:"digest"`
	}
	if json.Unmarshal(op.Result, &res) == nil && res.Digest != "" {
		targets = append(targets, res.Digest)
	}
	var err error
	if op.Error != nil {
		err = fmt.Errorf("%s: %w", op.Error.Detail, errdefs.FromCode(op.Error.Code))
	}
	s.RecordEvent(ActionOperationFinished, targets, err, map[string]any{
		"kind": op.Kind, "state": op.State, "duration_ms": float64(op.Updated.Sub(op.Created).Microseconds()) / 1000,
	})
}

// pathTargets extracts the {wildcard} segments of pattern from path, the
// request's escaped path, unescaping each segment as ServeMux does: an id
// holding an escaped slash ("a%2Fb") is one target, "a/b", as it was for
// the handler, not two.
func pathTargets(pattern, path string) []string {
	_, p, _ := strings.Cut(pattern, " ")
	ps, xs := strings.Split(p, "/"), strings.Split(path, "/")
	var out []string
	for i, seg := range ps {
		if strings.HasPrefix(seg, "{") && i < len(xs) {
			x, err := url.PathUnescape(xs[i])
			if err != nil {
				x = xs[i]
			}
			out = append(out, x)
		}
	}
	return out
}

type peerKey struct{}

// PeerContext is http.Server.ConnContext: it records who is on the other
// end of a connection, for the audit log. For a Unix socket that is the
// peer's uid and pid (SO_PEERCRED), for TCP its address.
func PeerContext(ctx context.Context, c net.Conn) context.Context {
	peer := c.RemoteAddr().String()
	if uc, ok := c.(*net.UnixConn); ok {
		peer = "unix"
		if raw, err := uc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
					peer = "unix:uid=" + strconv.Itoa(int(cred.Uid)) + ",pid=" + strconv.Itoa(int(cred.Pid))
				}
			})
		}
	}
	return context.WithValue(ctx, peerKey{}, peer)
}

func peerOf(r *http.Request) string {
	if p, ok := r.Context().Value(peerKey{}).(string); ok {
		return p
	}
	return r.RemoteAddr
}

// uniq drops repeated ids (a handler may note an id the path already
// names), keeping the first order.
func uniq(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
