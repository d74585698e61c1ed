package api

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
)

// auditNote is what a handler adds to its request's audit record: the ids
// it created or touched beyond those in the path, and the error it
// answered with.
type auditNote struct {
	mu      sync.Mutex
	targets []string
	err     error
}

type auditKey struct{}

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

// Audit records one hash-chained audit record per mutating request, after
// it is answered: who (token name, peer), what (the route as action, path
// ids and created ids as targets), the outcome and how long it took.
func (s *Server) auditRequests(mux *http.ServeMux, next http.Handler) http.Handler {
	if s.Audit == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !mutating(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		_, pattern := mux.Handler(r)
		note := &auditNote{}
		r = r.WithContext(context.WithValue(r.Context(), auditKey{}, note))
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		next.ServeHTTP(sw, r)
		note.mu.Lock()
		targets := uniq(append(pathTargets(pattern, r.URL.Path), note.targets...))
		err := note.err
		note.mu.Unlock()
		outcome, msg := audit.OutcomeOf(err)
		if err == nil && sw.status >= 400 {
			outcome = "http_" + http.StatusText(sw.status)
		}
		if pattern == "" {
			pattern = r.Method + " " + r.URL.Path
		}
		_, aerr := s.Audit.Append(audit.Record{
			RequestID: requestID(r), Token: auth.TokenName(r.Context()), Peer: peerOf(r),
			Action: pattern, Targets: targets, Outcome: outcome, Error: msg,
			DurationMillis: float64(time.Since(start).Microseconds()) / 1000,
		})
		if aerr != nil && s.Log != nil {
			s.Log.Error("audit log append failed", "request_id", requestID(r), "err", aerr)
		}
	})
}

// pathTargets extracts the {wildcard} segments of pattern from path.
func pathTargets(pattern, path string) []string {
	_, p, _ := strings.Cut(pattern, " ")
	ps, xs := strings.Split(p, "/"), strings.Split(path, "/")
	var out []string
	for i, seg := range ps {
		if strings.HasPrefix(seg, "{") && i < len(xs) {
			out = append(out, xs[i])
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
