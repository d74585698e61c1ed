package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestTenantQuotaOnSocket: tenants and quotas hold without --listen. On a
// daemon serving only its Unix socket, a CLI presenting a user token
// (FORKD_TOKEN) acts as the token's tenant: its quota refuses a fork past
// it with a 429 naming the quota, and it sees only its own sandboxes;
// the socket without a token stays the admin, who sees every tenant's; a
// token that does not verify is refused, never taken for the admin, and
// the refusal says how to act as the admin (unset FORKD_TOKEN). A token
// store others may read does not stop the socket-only daemon.
func TestTenantQuotaOnSocket(t *testing.T) {
	c := newCLI(t)
	id := snapshot.NewID()[:8]
	tag, name, tenant := "it-tq-"+id, "it-tq-"+id, "it-tq-"+id
	tok := strings.TrimSpace(c.ok("token", "create", name, "--tenant", tenant))
	defer c.run("token", "revoke", name)
	as := func(token string) *cli {
		u := *c
		u.env = append(slices.Clone(c.env), "FORKD_TOKEN="+token)
		return &u
	}
	user := as(tok)

	// A token store the daemon cannot trust (others may read it) does not
	// stop a daemon that serves only its socket: the admin is served, a
	// token is refused naming the fix, and fixing it needs no restart.
	store := filepath.Join(dataDir, auth.StoreFile)
	if err := os.Chmod(store, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(store, 0o600)
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal") // starts the daemon
	defer c.run("rmi", tag)
	if _, errs, code := user.run("ls"); code == 0 || !strings.Contains(errs, "chmod 600") {
		t.Errorf("a token against an unreadable store: exit %d, want the fix named\n%s", code, errs)
	}
	if err := os.Chmod(store, 0o600); err != nil {
		t.Fatal(err)
	}
	c.ok("snapshot", "share", tag, "--tenant", tenant)
	c.ok("tenant", "quota", tenant, "--max-sandboxes", "1")
	defer c.run("tenant", "quota", tenant, "--max-sandboxes", "0")

	if _, errs, code := user.run("fork", "--tag", tag, "-n", "2"); code == 0 || !strings.Contains(errs, "quota") || !strings.Contains(errs, tenant) {
		t.Fatalf("a fork of 2 past the tenant's quota of 1: exit %d\n%s", code, errs)
	}
	var mine apiv1.ForkResponse
	if err := json.Unmarshal([]byte(user.ok("fork", "--tag", tag, "--json")), &mine); err != nil || len(mine.Sandboxes) != 1 {
		t.Fatalf("a fork within the quota: %+v %v", mine, err)
	}
	var admins apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &admins); err != nil || len(admins.Sandboxes) != 1 {
		t.Fatalf("the admin's fork: %+v %v", admins, err)
	}
	defer c.run("kill", mine.Sandboxes[0].ID, admins.Sandboxes[0].ID)

	ids := func(sbs []apiv1.Sandbox) []string {
		var out []string
		for _, s := range sbs {
			out = append(out, s.ID)
		}
		return out
	}
	if got := ids(user.sandboxes()); !slices.Equal(got, []string{mine.Sandboxes[0].ID}) {
		t.Errorf("the tenant sees %v, want only its own %s", got, mine.Sandboxes[0].ID)
	}
	if got := ids(c.sandboxes()); !slices.Contains(got, mine.Sandboxes[0].ID) || !slices.Contains(got, admins.Sandboxes[0].ID) {
		t.Errorf("the socket's admin sees %v, want both sandboxes", got)
	}
	if _, errs, code := user.run("kill", admins.Sandboxes[0].ID); code == 0 {
		t.Errorf("the tenant killed the admin's sandbox: %s", errs)
	}
	if _, errs, code := as("not-a-token").run("ls"); code == 0 || !strings.Contains(errs, "not recognised") || !strings.Contains(errs, "unset FORKD_TOKEN") {
		t.Errorf("a bad token on the socket: exit %d\n%s", code, errs)
	}
}
