package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// A version 1 store, as forkd wrote it before roles: no role, no tenant.
const v1Store = `{
  "version": 1,
  "tokens": [
    {
      "name": "legacy",
      "sha256": "%s",
      "created": "2024-01-02T03:04:05Z"
    }
  ]
}
`

func TestVersion1StoreLoadsAsAdmins(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, StoreFile)
	const plain = Prefix + "legacy-token-from-an-older-forkd"
	sum := hexSum(plain)
	if err := os.WriteFile(path, []byte(strings.Replace(v1Store, "%s", sum, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := Open(path)
	if err != nil {
		t.Fatalf("version 1 store refused: %v", err)
	}
	e, ok := tk.Verify(plain)
	if !ok || e.Name != "legacy" || e.Role != RoleAdmin || e.Tenant != DefaultTenant {
		t.Fatalf("legacy token verifies as %+v %v, want an admin of %q", e, ok, DefaultTenant)
	}
	if l := tk.List(); len(l) != 1 || l[0].Role != RoleAdmin || l[0].Tenant != DefaultTenant {
		t.Errorf("List = %+v", l)
	}
	// The next change writes the store as version 2, the old token
	// explicit and still valid.
	if _, err := tk.Create("ci", RoleUser, "acme"); err != nil {
		t.Fatal(err)
	}
	var sf storeFile
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &sf); err != nil {
		t.Fatal(err)
	}
	if sf.Version != storeVersion || len(sf.Tokens) != 2 || sf.Tokens[0].Role != RoleAdmin || sf.Tokens[0].Tenant != DefaultTenant {
		t.Errorf("rewritten store: %s", data)
	}
	if e, ok := tk.Verify(plain); !ok || e.Role != RoleAdmin {
		t.Errorf("legacy token after the rewrite: %+v %v", e, ok)
	}
}

// hexSum is how the store records a token: the hex SHA-256 of its plaintext.
func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestStoreRefusesWhatItCannotTrust(t *testing.T) {
	for name, body := range map[string]string{
		"unknown role":  `{"version":2,"tokens":[{"name":"x","sha256":"` + hexSum("a") + `","created":"2024-01-01T00:00:00Z","role":"root","tenant":"t"}]}`,
		"bad tenant":    `{"version":2,"tokens":[{"name":"x","sha256":"` + hexSum("a") + `","created":"2024-01-01T00:00:00Z","role":"user","tenant":"a b"}]}`,
		"newer version": `{"version":3,"tokens":[]}`,
		"bad quota":     `{"version":2,"tokens":[],"quotas":{"acme":{"max_sandboxes":-1}}}`,
		"bad builds":    `{"version":2,"tokens":[],"quotas":{"acme":{"max_builds":1001}}}`,
	} {
		path := filepath.Join(t.TempDir(), StoreFile)
		os.WriteFile(path, []byte(body), 0o600)
		if _, err := Open(path); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("%s: Open = %v, want failed precondition", name, err)
		}
	}
}

func TestCreateRolesAndTenants(t *testing.T) {
	tk, _ := openStore(t)
	for _, c := range []struct {
		name, tenant string
		role         Role
		wantTenant   string
	}{
		{"ops", "", RoleAdmin, DefaultTenant},
		{"alice", "", RoleUser, "alice"},
		{"ci", "acme", RoleUser, "acme"},
		{"dash", "acme", RoleReadOnly, "acme"},
	} {
		tok, err := tk.Create(c.name, c.role, c.tenant)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if e, ok := tk.Verify(tok); !ok || e.Role != c.role || e.Tenant != c.wantTenant {
			t.Errorf("%s: %+v, want %s of %q", c.name, e, c.role, c.wantTenant)
		}
	}
	if _, err := tk.Create("x", "superuser", ""); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "admin, user, read-only") {
		t.Errorf("unknown role: %v", err)
	}
	if _, err := tk.Create("y", RoleUser, "bad tenant"); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "tenant name") {
		t.Errorf("bad tenant: %v", err)
	}
	if got := tk.Tenants(); strings.Join(got, ",") != "acme,alice,default" {
		t.Errorf("Tenants = %v", got)
	}
}

func TestMiddlewarePrincipal(t *testing.T) {
	tk, _ := openStore(t)
	tok, err := tk.Create("ci", RoleReadOnly, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var got Principal
	var had bool
	h := Middleware(tk, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, had = PrincipalFrom(r.Context())
	}))
	serve(h, "/v1/sandboxes", "Bearer "+tok)
	if !had || got != (Principal{Token: "ci", Role: RoleReadOnly, Tenant: "acme"}) {
		t.Errorf("token principal %+v %v", got, had)
	}
	serve(h, PublicPath, "")
	if had {
		t.Errorf("healthz carries a principal: %+v", got)
	}
	r := httptest.NewRequest(http.MethodGet, "/v1/sandboxes", nil)
	r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.UnixAddr{Name: "/run/forkd/forkd.sock", Net: "unix"}))
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !had || got != SocketPrincipal || !got.Admin() {
		t.Errorf("Unix socket principal %+v %v", got, had)
	}
	// On the socket, a token is the token's principal; a bad one is a 401.
	onSocket := func(authz string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/v1/sandboxes", nil)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.UnixAddr{Name: "/run/forkd/forkd.sock", Net: "unix"}))
		r.Header.Set("Authorization", authz)
		w := httptest.NewRecorder()
		got, had = Principal{}, false
		h.ServeHTTP(w, r)
		return w
	}
	if w := onSocket("Bearer " + tok); w.Code != http.StatusOK || !had || got != (Principal{Token: "ci", Role: RoleReadOnly, Tenant: "acme"}) {
		t.Errorf("Unix socket with a token: %d, principal %+v %v", w.Code, got, had)
	}
	if w := onSocket("Bearer not-a-token"); w.Code != http.StatusUnauthorized || had {
		t.Errorf("Unix socket with a bad token: %d, principal %+v %v", w.Code, got, had)
	}
	if s := (Principal{Token: "ci", Role: RoleUser, Tenant: "acme"}).String(); s != `token "ci" (user of tenant "acme")` {
		t.Errorf("String = %s", s)
	}
}

func TestPrincipalSees(t *testing.T) {
	admin := Principal{Role: RoleAdmin, Tenant: "ops"}
	user := Principal{Role: RoleUser, Tenant: "acme"}
	def := Principal{Role: RoleReadOnly, Tenant: DefaultTenant}
	for _, c := range []struct {
		p      Principal
		tenant string
		want   bool
	}{
		{admin, "acme", true}, {admin, "", true},
		{user, "acme", true}, {user, "other", false}, {user, "", false},
		{def, "", true}, {def, DefaultTenant, true}, {def, "acme", false},
	} {
		if got := c.p.Sees(c.tenant); got != c.want {
			t.Errorf("%v sees %q: %v, want %v", c.p, c.tenant, got, c.want)
		}
	}
	if user.Admin() || !user.CanWrite() || def.CanWrite() || !admin.CanWrite() {
		t.Error("role predicates")
	}
}

func TestQuotas(t *testing.T) {
	tk, path := openStore(t)
	if _, err := tk.Create("ci", RoleUser, "acme"); err != nil {
		t.Fatal(err)
	}
	if q, own := tk.QuotaOf("acme"); !q.IsZero() || own {
		t.Errorf("no quota set: %+v %v", q, own)
	}
	for _, c := range []struct {
		q    Quota
		says string
	}{
		{Quota{MaxSandboxes: -1}, "max_sandboxes -1 out of range: 0 (no limit) to 100000"},
		{Quota{MaxSandboxes: MaxQuotaSandboxes + 1}, "max_sandboxes 100001 out of range"},
		{Quota{MaxMemoryMiB: -5}, "max_memory_mib -5 out of range: 0 (no limit) to 1073741824"},
		{Quota{MaxBuilds: -1}, "max_builds -1 out of range: 0 (no limit of its own) to 1000"},
		{Quota{MaxBuilds: MaxQuotaBuilds + 1}, "max_builds 1001 out of range"},
	} {
		if err := tk.SetQuota("acme", c.q); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("SetQuota(%+v) = %v, want invalid argument saying %q", c.q, err, c.says)
		}
	}
	if err := tk.SetQuota("no such/tenant", Quota{MaxSandboxes: 1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad tenant name: %v", err)
	}
	if err := tk.SetQuota(QuotaDefault, Quota{MaxSandboxes: 5}); err != nil {
		t.Fatal(err)
	}
	if err := tk.SetQuota("acme", Quota{MaxSandboxes: 2, MaxMemoryMiB: 1024, MaxBuilds: 1}); err != nil {
		t.Fatal(err)
	}
	// Another process (the daemon) sees them; token changes keep them.
	other, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Create("bob", RoleUser, ""); err != nil {
		t.Fatal(err)
	}
	if q, own := other.QuotaOf("acme"); !own || q != (Quota{MaxSandboxes: 2, MaxMemoryMiB: 1024, MaxBuilds: 1}) {
		t.Errorf("acme quota %+v %v", q, own)
	}
	if q, own := other.QuotaOf("bob"); own || q != (Quota{MaxSandboxes: 5}) {
		t.Errorf("bob gets the default: %+v %v", q, own)
	}
	// A quota of builds alone is a quota (not the zero one that removes).
	if err := tk.SetQuota("acme", Quota{MaxBuilds: 3}); err != nil {
		t.Fatal(err)
	}
	if q, own := other.QuotaOf("acme"); !own || q != (Quota{MaxBuilds: 3}) {
		t.Errorf("acme's builds-only quota %+v %v", q, own)
	}
	if err := tk.SetQuota("acme", Quota{}); err != nil {
		t.Fatal(err)
	}
	if q, own := other.QuotaOf("acme"); own || q != (Quota{MaxSandboxes: 5}) {
		t.Errorf("a zero quota removes acme's own: %+v %v", q, own)
	}
	if got := other.Tenants(); strings.Join(got, ",") != "acme,bob" {
		t.Errorf("Tenants = %v", got)
	}
}
