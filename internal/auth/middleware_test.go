package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// echoName answers with the authenticated token name.
var echoName = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	p, _ := PrincipalFrom(r.Context())
	io.WriteString(w, "name="+p.Token)
})

func storeWithToken(t *testing.T, name string) (*Tokens, string) {
	t.Helper()
	tk, _ := openStore(t)
	tok, err := tk.Create(name, RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	return tk, tok
}

func serve(h http.Handler, path, authz string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if authz != "" {
		r.Header.Set("Authorization", authz)
	}
	rec := httptest.NewRecorder()
	rec.Header().Set("X-Request-Id", "rid-1") // as the API's outer handler does
	h.ServeHTTP(rec, r)
	return rec
}

func checkUnauthorized(t *testing.T, rec *httptest.ResponseRecorder, challenge string) {
	t.Helper()
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401 (%s)", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("content type %q", ct)
	}
	if got := rec.Header().Get("WWW-Authenticate"); got != challenge {
		t.Errorf("WWW-Authenticate %q, want %q", got, challenge)
	}
	var p apiv1.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != 401 || p.Code != "unauthenticated" || p.Title != "Unauthorized" || p.Detail == "" ||
		p.Type != "https://forkd.dev/problems/unauthenticated" || p.RequestID != "rid-1" {
		t.Errorf("problem %+v", p)
	}
	if !errors.Is(errdefs.FromCode(p.Code), errdefs.ErrUnauthenticated) {
		t.Errorf("code %q does not map back to ErrUnauthenticated", p.Code)
	}
}

func TestMiddleware(t *testing.T) {
	tk, tok := storeWithToken(t, "ci")
	h := Middleware(tk, echoName)

	if rec := serve(h, PublicPath, ""); rec.Code != 200 || rec.Body.String() != "name=" {
		t.Errorf("healthz without a token: %d %s", rec.Code, rec.Body)
	}
	for _, path := range []string{"/v1/sandboxes", "/metrics", "/v1/openapi.json", "/v1/healthz/x", "//v1/healthz", "/"} {
		checkUnauthorized(t, serve(h, path, ""), `Bearer realm="forkd"`)
	}
	checkUnauthorized(t, serve(h, "/v1/version", "Basic "+tok), `Bearer realm="forkd"`)
	checkUnauthorized(t, serve(h, "/v1/version", "Bearer"), `Bearer realm="forkd"`)
	checkUnauthorized(t, serve(h, "/v1/version", "Bearer forkd_wrong"), `Bearer realm="forkd", error="invalid_token"`)
	checkUnauthorized(t, serve(h, "/v1/version", "Bearer "+tok+"x"), `Bearer realm="forkd", error="invalid_token"`)

	for _, authz := range []string{"Bearer " + tok, "bearer " + tok, "BEARER  " + tok + " "} {
		if rec := serve(h, "/v1/version", authz); rec.Code != 200 || rec.Body.String() != "name=ci" {
			t.Errorf("%q: %d %s", authz, rec.Code, rec.Body)
		}
	}

	// Revocation takes effect on the next request.
	if err := tk.Revoke("ci"); err != nil {
		t.Fatal(err)
	}
	checkUnauthorized(t, serve(h, "/v1/version", "Bearer "+tok), `Bearer realm="forkd", error="invalid_token"`)

	// No store: nothing but healthz.
	checkUnauthorized(t, serve(Middleware(nil, echoName), "/v1/version", "Bearer "+tok), `Bearer realm="forkd", error="invalid_token"`)
}

func TestMiddlewareTrustsOnlyUnixSocketConnections(t *testing.T) {
	tk, _ := openStore(t)
	h := Middleware(tk, echoName)
	for addr, want := range map[net.Addr]int{
		&net.UnixAddr{Name: "/run/forkd/forkd.sock", Net: "unix"}: 200,
		&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7777}:      401,
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/version", nil)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, addr))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != want {
			t.Errorf("local address %v: status %d, want %d", addr, rec.Code, want)
		}
	}

	// End to end on a real Unix socket.
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Get("http://forkd/v1/version")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("Unix socket request: status %d", resp.StatusCode)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and localhost and its key.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "forkd test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile, pool
}

func TestTLSAndTokenEndToEnd(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	tk, tok := storeWithToken(t, "remote")
	// Every interface: allowed because of TLS.
	ln, err := Listen(ListenConfig{Addr: "0.0.0.0:0", CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Middleware(tk, echoName), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	url := "https://127.0.0.1:" + strconv.Itoa(port)

	get := func(c *http.Client, authz string) (*http.Response, string, error) {
		req, _ := http.NewRequest(http.MethodGet, url+"/v1/version", nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}

	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, body, err := get(h1, "Bearer "+tok)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || body != "name=remote" || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Errorf("authenticated TLS request: %d %q %+v", resp.StatusCode, body, resp.TLS)
	}
	if resp, _, err := get(h1, ""); err != nil || resp.StatusCode != 401 {
		t.Errorf("TLS request without a token: %v %v", resp, err)
	}

	// HTTP/2 is offered (multiplexed SDK clients).
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	if resp, body, err := get(h2, "Bearer "+tok); err != nil || resp.ProtoMajor != 2 || body != "name=remote" {
		t.Errorf("HTTP/2: %v %q %v", resp, body, err)
	}

	// Old TLS is refused; so is an untrusted certificate and plaintext HTTP.
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}}}
	if _, _, err := get(old, "Bearer "+tok); err == nil {
		t.Error("TLS 1.1 handshake succeeded")
	}
	if _, _, err := get(&http.Client{}, "Bearer "+tok); err == nil {
		t.Error("untrusted certificate accepted")
	}
	plain, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/v1/healthz")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS port: %d", plain.StatusCode)
		}
	}
}

func TestLoopbackWithoutTLSStillNeedsTokens(t *testing.T) {
	tk, tok := storeWithToken(t, "local")
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		ln, err := Listen(ListenConfig{Addr: addr})
		if err != nil {
			if addr == "[::1]:0" {
				t.Logf("no IPv6 loopback here: %v", err)
				continue
			}
			t.Fatalf("%s: %v", addr, err)
		}
		srv := &http.Server{Handler: Middleware(tk, echoName)}
		go srv.Serve(ln)
		base := "http://" + ln.Addr().String()
		resp, err := http.Get(base + "/v1/sandboxes")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("%s: no token: status %d", addr, resp.StatusCode)
		}
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "name=local" {
			t.Errorf("%s: token: %d %s", addr, resp.StatusCode, b)
		}
		srv.Close()
	}
}

func TestListenRefusesExposedPlaintext(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		ln, err := Listen(ListenConfig{Addr: addr})
		if err == nil {
			ln.Close()
			t.Errorf("%s without TLS: listening", addr)
			continue
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--tls-cert") || !strings.Contains(err.Error(), "--insecure-no-tls-or-auth-i-know") {
			t.Errorf("%s: %v, want invalid argument naming the fix", addr, err)
		}
	}
	// Explicitly forced.
	ln, err := Listen(ListenConfig{Addr: "0.0.0.0:0", Insecure: true})
	if err != nil {
		t.Fatalf("--insecure: %v", err)
	}
	ln.Close()

	certFile, keyFile, _ := selfSigned(t)
	for name, cfg := range map[string]ListenConfig{
		"cert without key": {Addr: "127.0.0.1:0", CertFile: certFile},
		"key without cert": {Addr: "127.0.0.1:0", KeyFile: keyFile},
		"key mismatch":     {Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: certFile},
		"missing files":    {Addr: "127.0.0.1:0", CertFile: certFile + ".no", KeyFile: keyFile},
		"no port":          {Addr: "127.0.0.1"},
	} {
		if ln, err := Listen(cfg); !errdefs.IsInvalidArgument(err) {
			if ln != nil {
				ln.Close()
			}
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
}

// TestMiddlewareSocketAuthorization: on the Unix socket only a bearer token
// is forkd's. Another scheme is the app's and passes as the socket's admin;
// a bearer token that does not verify is refused with the way out; one
// that verifies is marked consumed (the port proxy strips only that).
func TestMiddlewareSocketAuthorization(t *testing.T) {
	tk, tok := storeWithToken(t, "ci")
	var consumed bool
	h := Middleware(tk, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		consumed = TokenConsumed(r.Context())
		echoName.ServeHTTP(w, r)
	}))
	onSocket := func(authz string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/v1/version", nil)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.UnixAddr{Name: "/run/forkd/forkd.sock", Net: "unix"}))
		if authz != "" {
			r.Header.Set("Authorization", authz)
		}
		rec := httptest.NewRecorder()
		rec.Header().Set("X-Request-Id", "rid-1")
		h.ServeHTTP(rec, r)
		return rec
	}
	for _, authz := range []string{"", "Basic YXBwOnB3", "Digest username=\"app\"", "Bearer"} {
		consumed = true
		if rec := onSocket(authz); rec.Code != 200 || rec.Body.String() != "name=" || consumed {
			t.Errorf("socket with %q: %d %s consumed=%v, want the socket's admin, header left to the app", authz, rec.Code, rec.Body, consumed)
		}
	}
	if rec := onSocket("Bearer " + tok); rec.Code != 200 || rec.Body.String() != "name=ci" || !consumed {
		t.Errorf("socket with a valid token: %d %s consumed=%v", rec.Code, rec.Body, consumed)
	}
	rec := onSocket("Bearer forkd_from_another_daemon")
	checkUnauthorized(t, rec, `Bearer realm="forkd", error="invalid_token"`)
	if !strings.Contains(rec.Body.String(), "unset FORKD_TOKEN") {
		t.Errorf("socket 401 does not say how to act as the socket's admin: %s", rec.Body)
	}

	// A store that cannot be read says why, not "not recognised".
	if err := os.Chmod(tk.Path(), 0o644); err != nil {
		t.Fatal(err)
	}
	rec = serve(h, "/v1/version", "Bearer "+tok)
	checkUnauthorized(t, rec, `Bearer realm="forkd", error="invalid_token"`)
	if !strings.Contains(rec.Body.String(), "chmod 600") {
		t.Errorf("unreadable store: 401 does not name the problem: %s", rec.Body)
	}
}
