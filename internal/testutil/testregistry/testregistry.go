// Package testregistry starts a real OCI registry for a test
// (internal/localregistry: Debian's docker-registry, distribution 2.8, on a
// unix socket behind a loopback proxy) and counts the blob GETs going
// through it (so a test can say which blobs a pull fetched).
//
// Without the registry's binary the test is skipped, or fails under
// FORKD_TEST_PRIVILEGED=1 (testutil.Unavailable).
package testregistry

import (
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/localregistry"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// Binary is the registry's executable, from Debian's docker-registry.
const Binary = localregistry.Binary

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
	if _, err := exec.LookPath(Binary); err != nil {
		testutil.Unavailable(t, "needs a real registry: %s is not in PATH (Debian package docker-registry; `make test-deps` installs it)", Binary)
		return nil
	}
	// A short directory: a unix socket's path is at most 107 bytes.
	dir, err := os.MkdirTemp("", "forkd-registry-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &Registry{}
	lr, err := localregistry.Start(dir, localregistry.Options{OnBlobGet: func(d string) {
		r.mu.Lock()
		r.gets = append(r.gets, d)
		r.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lr.Close()
		if t.Failed() {
			t.Logf("%s log:\n%s", Binary, lr.Logs())
		}
	})
	r.Host = lr.Host
	return r
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
