package oci

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestPullErrorClasses: what a registry answers becomes an error class
// (from oras-go's typed errors, not their text) and a message that names
// the registry, the reference and what to do.
func TestPullErrorClasses(t *testing.T) {
	status := func(code int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			w.Write([]byte(body))
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	// A port nothing listens on: taken, then released.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name, host string
		is         func(error) bool
		want       []string
	}{
		{"unknown tag", status(http.StatusNotFound, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}`),
			errdefs.IsNotFound, []string{"/forkd/x:v1", "not found in registry"}},
		{"unauthorized", status(http.StatusUnauthorized, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`),
			errdefs.IsPermissionDenied, []string{"/forkd/x:v1", "HTTP 401", "authentication required", "docker login 127.0.0.1:"}},
		{"forbidden", status(http.StatusForbidden, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`),
			errdefs.IsPermissionDenied, []string{"HTTP 403", "denied", "docker login"}},
		{"server error", status(http.StatusInternalServerError, ``),
			errdefs.IsUnavailable, []string{"HTTP 500", "Internal Server Error"}},
		{"unreachable", closed, errdefs.IsUnavailable, []string{closed, "unreachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Pull(context.Background(), t.TempDir(), tc.host+"/forkd/x:v1", PullOptions{})
			t.Logf("%v", err)
			if err == nil || !tc.is(err) {
				t.Fatalf("got %v, want another class", err)
			}
			for _, w := range append(tc.want, tc.host) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, _, err := Pull(ctx, t.TempDir(), closed+"/forkd/x:v1", PullOptions{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want Canceled", err)
		}
	})
}
