// Package localregistry runs a real OCI registry on this host for tests
// and benchmarks: Debian's docker-registry (distribution 2.8), with its
// storage in a directory the caller gives and listening on a unix socket,
// fronted by a reverse proxy on a loopback port (127.0.0.1, plain HTTP) that
// can report each blob GET. Nothing listens on any other address.
//
// The binary comes from the docker-registry package (scripts/install-deps.sh
// --test or --bench installs it).
package localregistry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
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
	// Host is where clients reach it: 127.0.0.1:port (plain HTTP).
	Host string

	cmd       *exec.Cmd
	exited    chan error
	logs      *syncBuffer
	srv       *http.Server
	transport *http.Transport
}

// Options configure Start.
type Options struct {
	// OnBlobGet, if set, is called with the digest of each blob GET.
	OnBlobGet func(digest string)
}

// Start runs a registry with its socket, configuration and storage in dir
// (a short path: a unix socket's is at most 107 bytes). Close stops it.
func Start(dir string, o Options) (*Registry, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("%s is not in PATH (Debian package docker-registry; scripts/install-deps.sh --test installs it): %w",
			Binary, errdefs.ErrFailedPrecondition)
	}
	sock := filepath.Join(dir, "registry.sock")
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(config, filepath.Join(dir, "storage"), sock)), 0o600); err != nil {
		return nil, err
	}
	r := &Registry{logs: &syncBuffer{}, exited: make(chan error, 1)}
	r.cmd = exec.Command(bin, "serve", cfg)
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { r.exited <- r.cmd.Wait() }()
	r.transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	if err := r.waitReady(); err != nil {
		r.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.Close()
		return nil, err
	}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: "registry"})
	proxy.Transport = r.transport
	proxy.FlushInterval = -1 // stream blobs as they come
	// The registry sees the proxy's Host, so the upload locations it
	// hands out point back through the proxy.
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if m := blobPath.FindStringSubmatch(req.URL.Path); m != nil && req.Method == http.MethodGet && o.OnBlobGet != nil {
			o.OnBlobGet(m[1])
		}
		proxy.ServeHTTP(w, req)
	}), ReadHeaderTimeout: time.Minute}
	go r.srv.Serve(ln)
	r.Host = ln.Addr().String()
	return r, nil
}

// waitReady polls the registry's /v2/ until it answers; it fails if the
// process exits first or does not answer within a minute.
func (r *Registry) waitReady() error {
	c := &http.Client{Transport: r.transport, Timeout: 10 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := c.Get("http://registry/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case werr := <-r.exited:
			r.exited <- werr
			return fmt.Errorf("%s exited (%v) before it served:\n%s", Binary, werr, r.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer on its socket within a minute (last: %v):\n%s", Binary, err, r.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Logs is what the registry wrote to stdout and stderr.
func (r *Registry) Logs() string { return r.logs.String() }

// Close stops the proxy and the registry and waits for it to exit.
func (r *Registry) Close() error {
	var errs []error
	if r.srv != nil {
		errs = append(errs, r.srv.Close())
	}
	r.transport.CloseIdleConnections()
	r.cmd.Process.Kill()
	<-r.exited
	return errors.Join(errs...)
}

// syncBuffer is a strings.Builder safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
