package auth

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// PublicPath is the one path served without a token.
const PublicPath = "/v1/healthz"

// Middleware requires "Authorization: Bearer <token>" with a token of
// tokens on every request except PublicPath, and puts the token's
// Principal (name, role, tenant) in the request context (PrincipalFrom).
// A request without a valid token gets a 401 problem+json (code
// "unauthenticated") with a WWW-Authenticate header. What the principal
// may do is decided inside (internal/api's authorize).
//
// Requests that arrived on a Unix socket without a bearer token pass as
// SocketPrincipal (an admin): the socket's mode is their authentication.
// Another scheme there (Basic, say) is not forkd's: it passes untouched,
// for an app behind the port proxy. One that presents a bearer token acts
// as that token's principal, held to its role, tenant and quotas like a
// caller over TCP (a local orchestrator confining each of its agents to a
// tenant without a TCP listener), and a token that does not verify is a
// 401 there too, never a silent admin; its message says how to act as the
// socket's admin instead (FORKD_TOKEN left over from a remote daemon).
// Arrival is decided from the connection's local address
// (http.LocalAddrContextKey, set by http.Server) being a *net.UnixAddr; a
// request without that information needs a token. So one handler can
// serve the Unix socket and TCP listeners alike.
//
// Where the bearer token was consumed, TokenConsumed reports it, so the
// port proxy strips it and passes any other Authorization to the app.
//
// A nil tokens refuses every request that needs a token.
func Middleware(tokens *Tokens, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		presented, isBearer := bearer(r.Header.Get("Authorization"))
		socket := fromUnixSocket(r)
		if socket && !isBearer {
			next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), SocketPrincipal)))
			return
		}
		if r.URL.Path == PublicPath {
			next.ServeHTTP(w, r)
			return
		}
		if !isBearer {
			unauthorized(w, `Bearer realm="forkd"`,
				fmt.Errorf("missing Authorization: Bearer token; the daemon wrote its first token to DATA_DIR/%s (create more with `forkd token create NAME`): %w", FirstTokenFile, errdefs.ErrUnauthenticated))
			return
		}
		var entry Entry
		ok := false
		if tokens != nil {
			entry, ok = tokens.Verify(presented)
		}
		if !ok {
			unauthorized(w, `Bearer realm="forkd", error="invalid_token"`, notRecognised(tokens, socket))
			return
		}
		ctx := context.WithValue(WithPrincipal(r.Context(), principalOf(entry)), consumedKey{}, true)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// notRecognised explains a bearer token that did not verify: the store
// may be unreadable, and on the socket the caller may have meant to act
// as its admin.
func notRecognised(tokens *Tokens, socket bool) error {
	msg := "bearer token not recognised (revoked, or from another daemon); see `forkd token list`"
	if tokens != nil {
		if err := tokens.Err(); err != nil {
			msg = fmt.Sprintf("bearer token not checked: %v", err)
		}
	}
	if socket {
		msg += "; on the Unix socket a request without a token acts as its admin: unset FORKD_TOKEN if it names another daemon's token"
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrUnauthenticated)
}

type consumedKey struct{}

// TokenConsumed reports whether Middleware authenticated the request by
// its Authorization header (a forkd token, not the app's to see).
func TokenConsumed(ctx context.Context) bool {
	v, _ := ctx.Value(consumedKey{}).(bool)
	return v
}

func fromUnixSocket(r *http.Request) bool {
	addr, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	_, ok := addr.(*net.UnixAddr)
	return ok
}

// bearer extracts the token of an "Authorization: Bearer <token>" header
// (the scheme is case-insensitive, RFC 9110 section 11.1).
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// unauthorized writes a 401 RFC 9457 problem. The request id is the one the
// API's outer handler already put on the response, if any.
func unauthorized(w http.ResponseWriter, challenge string, err error) {
	h := w.Header()
	h.Set("WWW-Authenticate", challenge)
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusUnauthorized)
	json.NewEncoder(w).Encode(apiv1.Problem{
		Type:      "https://forkd.dev/problems/" + errdefs.Code(err),
		Title:     http.StatusText(http.StatusUnauthorized),
		Status:    http.StatusUnauthorized,
		Detail:    err.Error(),
		Code:      errdefs.Code(err),
		RequestID: h.Get("X-Request-Id"),
	})
}
