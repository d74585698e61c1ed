package api

import (
	"testing"

	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// A tenant gets maxTenantExecSessions sessions, another tenant and an
// admin theirs; a released slot is free again, however often released.
func TestSessionSlots(t *testing.T) {
	var s sessionSlots
	alice := auth.Principal{Role: auth.RoleUser, Tenant: "alice"}
	var releases []func()
	for range maxTenantExecSessions {
		rel, err := s.take(alice, "exec sessions")
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, rel)
	}
	if _, err := s.take(alice, "exec sessions"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("session %d of a tenant: %v, want resource_exhausted", maxTenantExecSessions+1, err)
	}
	bob := auth.Principal{Role: auth.RoleUser, Tenant: "bob"}
	relBob, err := s.take(bob, "exec sessions")
	if err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if _, err := s.take(auth.Principal{Role: auth.RoleAdmin}, "exec sessions"); err != nil {
		t.Fatalf("an admin: %v", err)
	}
	releases[0]()
	releases[0]()
	if _, err := s.take(alice, "exec sessions"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := s.take(alice, "exec sessions"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a double release freed two slots: %v", err)
	}
	relBob()
	if s.byTenant["bob"] != 0 {
		t.Fatalf("bob's count after release: %d", s.byTenant["bob"])
	}
}
