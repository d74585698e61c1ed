package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestTenantCalls: the tenant and sharing calls hit their routes with
// their bodies, and a 403 comes back as ErrPermissionDenied.
func TestTenantCalls(t *testing.T) {
	var got []string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.EscapedPath()+" "+strings.TrimSpace(string(body)))
		switch {
		case strings.Contains(r.URL.Path, "/shares/"):
			json.NewEncoder(w).Encode(apiv1.Snapshot{Tag: "py", Owner: "acme", SharedWith: []string{"beta"}})
		case r.URL.Path == "/v1/tenants":
			json.NewEncoder(w).Encode([]apiv1.Tenant{{Name: "acme"}})
		case r.Method == http.MethodPut:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(apiv1.Problem{Status: 403, Code: "permission_denied", Detail: "needs the admin role: permission denied"})
		default:
			json.NewEncoder(w).Encode(apiv1.Tenant{Name: "acme", Quota: apiv1.Quota{MaxSandboxes: 3}})
		}
	})
	ctx := context.Background()
	if s, err := c.ShareSnapshot(ctx, "py", "beta"); err != nil || s.Owner != "acme" || s.SharedWith[0] != "beta" {
		t.Errorf("ShareSnapshot: %+v %v", s, err)
	}
	if _, err := c.UnshareSnapshot(ctx, "py", apiv1.ShareAll); err != nil {
		t.Error(err)
	}
	if l, err := c.Tenants(ctx); err != nil || len(l) != 1 {
		t.Errorf("Tenants: %+v %v", l, err)
	}
	if ten, err := c.Tenant(ctx, "acme"); err != nil || ten.Quota.MaxSandboxes != 3 {
		t.Errorf("Tenant: %+v %v", ten, err)
	}
	_, err := c.SetQuota(ctx, "acme", apiv1.Quota{MaxSandboxes: 2})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "admin role") {
		t.Errorf("SetQuota refused: %v, want permission denied", err)
	}
	want := []string{
		"PUT /v1/snapshots/py/shares/beta ",
		"DELETE /v1/snapshots/py/shares/%2A ",
		"GET /v1/tenants ",
		"GET /v1/tenants/acme ",
		`PUT /v1/tenants/acme/quota {"max_sandboxes":2,"max_memory_mib":0}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
