// Package testregistry starts a real OCI registry for a test: Debian's
// docker-registry (distribution 2.8), with its storage in a temporary
// directory and listening on a unix socket, fronted by a reverse proxy on a
// loopback port that counts the blob GETs going through it (so a test can
// say which blobs a pull fetched).
//
// The registry is the docker-registry package (scripts/install-deps.sh
// --test installs it); without its binary the test is skipped, or fails
// under FORKD_TEST_PRIVILEGED=1 (testutil.Unavailable).
package testregistry

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil"
)

// Binary is the registry's executable, from Debian's docker-registry.
const Binary = "docker-registry"

// config is a minimal distribution configuration: filesystem storage, no
// auth, a unix socket (no port to race for), errors only in the log.
const config = `version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  net: unix
  addr: %s
`

var blobPath = regexp.MustCompile(`^/v2/.+/blobs/(sha256:[0-9a-f]{64})$`)

// Registry is a running registry.
type Registry struct {
	// Host is where clients reach it: 127.0.0.1:port (plain HTTP, as
	// forkd uses for a loopback registry).
	Host string
	mu   sync.Mutex
	gets []string // digests of blob GETs, in order
}

// Start runs a registry until the test ends.
func Start(t testing.TB) *Registry {
	t.Helper()
	bin, err := exec.LookPath(Binary)
	if err != nil {
		testutil.Unavailable(t, "needs a real registry: %s is not in PATH (Debian package docker-registry; `make test-deps` installs it)", Binary)
		return nil
	}
	// A short directory: a unix socket's path is at most 107 bytes.
	dir, err := os.MkdirTemp("", "forkd-registry-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "registry.sock")
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(config, filepath.Join(dir, "storage"), sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s log:\n%s", Binary, logs.String())
		}
	})

	transport := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(transport.CloseIdleConnections)
	waitReady(t, &http.Client{Transport: transport}, exited, &logs)

	r := &Registry{}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: "registry"})
	proxy.Transport = transport
	proxy.FlushInterval = -1 // stream blobs as they come
	// The registry sees the proxy's Host, so the upload locations it
	// hands out point back through the proxy.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if m := blobPath.FindStringSubmatch(req.URL.Path); m != nil && req.Method == http.MethodGet {
			r.mu.Lock()
			r.gets = append(r.gets, m[1])
			r.mu.Unlock()
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// waitReady polls the registry's /v2/ until it answers, failing t if the
// process exits first or it does not answer within a minute.
func waitReady(t testing.TB, c *http.Client, exited <-chan error, logs *testutil.SyncBuffer) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := c.Get("http://registry/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case werr := <-exited:
			t.Fatalf("%s exited (%v) before it served:\n%s", Binary, werr, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer on its socket within a minute (last: %v):\n%s", Binary, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BlobGets returns the digests of the blob GETs since the last call, in
// order, and forgets them.
func (r *Registry) BlobGets() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.gets
	r.gets = nil
	return g
}
