package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func openStore(t *testing.T) (*Tokens, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), StoreFile)
	tk, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return tk, path
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestCreateVerifyRevoke(t *testing.T) {
	tk, path := openStore(t)
	if _, ok := tk.Verify("forkd_anything"); ok {
		t.Fatal("empty store verified a token")
	}
	a, err := tk.Create("ci", RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tk.Create("alice", RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(a, Prefix))
	if !strings.HasPrefix(a, Prefix) || err != nil || len(raw) < 32 {
		t.Fatalf("token %q: want %s + base64url of >= 32 bytes (%d bytes, %v)", a, Prefix, len(raw), err)
	}
	if a == b {
		t.Fatal("two tokens are equal")
	}
	for tok, want := range map[string]string{a: "ci", b: "alice"} {
		if e, ok := tk.Verify(tok); !ok || e.Name != want {
			t.Errorf("Verify(%s token) = %+v, %v", want, e, ok)
		}
	}
	for _, bad := range []string{"", a[:len(a)-1], a + "x", strings.ToUpper(a), Prefix} {
		if e, ok := tk.Verify(bad); ok {
			t.Errorf("Verify(%q) accepted as %q", bad, e.Name)
		}
	}
	if list := tk.List(); len(list) != 2 || list[0].Name != "alice" || list[1].Name != "ci" || list[0].Created.IsZero() {
		t.Errorf("List = %+v", list)
	}

	if m := mode(t, path); m != 0o600 {
		t.Errorf("store mode %04o, want 0600", m)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{a, b} {
		secret := strings.TrimPrefix(tok, Prefix)
		if strings.Contains(string(data), secret) || strings.Contains(string(data), secret[:16]) {
			t.Errorf("store holds token plaintext:\n%s", data)
		}
		sum := sha256.Sum256([]byte(tok))
		if !strings.Contains(string(data), hex.EncodeToString(sum[:])) {
			t.Errorf("store lacks the token's SHA-256:\n%s", data)
		}
	}
	if tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp*")); len(tmps) > 0 {
		t.Errorf("temporary files left: %v", tmps)
	}

	if err := tk.Revoke("ci"); err != nil {
		t.Fatal(err)
	}
	if _, ok := tk.Verify(a); ok {
		t.Error("revoked token still verifies")
	}
	if e, ok := tk.Verify(b); !ok || e.Name != "alice" {
		t.Error("revoking one token broke another")
	}
	if err := tk.Revoke("ci"); !errdefs.IsNotFound(err) {
		t.Errorf("second Revoke: %v, want not found", err)
	}
	if _, err := tk.Create("alice", RoleAdmin, ""); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate name: %v, want already exists", err)
	}
	for _, name := range []string{"", "-x", "a b", "a/b", strings.Repeat("n", 65)} {
		if _, err := tk.Create(name, RoleAdmin, ""); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Create(%q): %v, want invalid argument", name, err)
		}
	}
}

func TestStoreSharedBetweenProcesses(t *testing.T) {
	daemon, path := openStore(t)
	cli, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cli.Create("laptop", RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := daemon.Verify(tok); !ok || e.Name != "laptop" {
		t.Fatal("a token created by another store instance is not seen")
	}
	if err := cli.Revoke("laptop"); err != nil {
		t.Fatal(err)
	}
	if _, ok := daemon.Verify(tok); ok {
		t.Fatal("a token revoked by another store instance still verifies")
	}
	// A fresh Open sees the same state.
	again, err := Open(path)
	if err != nil || len(again.List()) != 0 {
		t.Fatalf("reopen: %v %v", again.List(), err)
	}
}

func TestConcurrentCreates(t *testing.T) {
	tk, path := openStore(t)
	other, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	toks := make([]string, 20)
	for i := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := tk
			if i%2 == 1 {
				s = other
			}
			tok, err := s.Create("t"+string(rune('a'+i)), RoleUser, "")
			if err != nil {
				t.Error(err)
			}
			toks[i] = tok
			s.Verify(tok)
		}()
	}
	wg.Wait()
	for i, tok := range toks {
		if e, ok := tk.Verify(tok); !ok || e.Name != "t"+string(rune('a'+i)) {
			t.Errorf("token %d lost by a concurrent write (%+v %v)", i, e, ok)
		}
	}
}

func TestVerifyComparesEveryEntryInConstantTime(t *testing.T) {
	tk, _ := openStore(t)
	var toks []string
	for _, n := range []string{"a", "b", "c"} {
		tok, err := tk.Create(n, RoleAdmin, "")
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	calls := 0
	orig := constantTimeCompare
	constantTimeCompare = func(x, y []byte) int {
		calls++
		if len(x) != sha256.Size || len(y) != sha256.Size {
			t.Errorf("compared %d and %d bytes, want two SHA-256 sums", len(x), len(y))
		}
		return orig(x, y)
	}
	t.Cleanup(func() { constantTimeCompare = orig })
	for _, tok := range []string{toks[0], toks[2], "forkd_nope"} {
		calls = 0
		tk.Verify(tok)
		if calls != 3 {
			t.Errorf("Verify made %d constant-time comparisons, want one per entry (3), match or not", calls)
		}
	}
}

func TestStorePermissions(t *testing.T) {
	tk, path := openStore(t)
	tok, err := tk.Create("x", RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	failed, err := Open(path)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("Open of a 0644 store: %v, want failed precondition naming chmod 600", err)
	}
	// The store Open returns with the error (a socket-only daemon serves
	// on with it) verifies nothing until the file is fixed.
	if _, ok := failed.Verify(tok); ok {
		t.Error("token verified by a store opened from a file others can read")
	}
	defer func() {
		if _, ok := failed.Verify(tok); !ok {
			t.Error("store opened failed did not recover after chmod 600")
		}
	}()
	// The running store fails closed.
	if _, ok := tk.Verify(tok); ok {
		t.Error("token verified from a store others can read")
	}
	if tk.Err() == nil {
		t.Error("Err() nil for an unreadable store")
	}
	os.Chmod(path, 0o600)
	if _, ok := tk.Verify(tok); !ok {
		t.Error("store did not recover after chmod 600")
	}
}

func TestMalformedStoreFailsClosed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, StoreFile)
	os.WriteFile(path, []byte(`{"version":1,"tokens":[{"name":"x","sha256":"zz"}]}`), 0o600)
	if _, err := Open(path); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("bad hash: %v", err)
	}
	os.WriteFile(path, []byte(`{"version":1,"tokens":[{"name":"x","plaintext":"forkd_x"}]}`), 0o600)
	if _, err := Open(path); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("unknown field: %v", err)
	}
}

func TestEnsureFirst(t *testing.T) {
	dir := t.TempDir()
	store, out := filepath.Join(dir, StoreFile), filepath.Join(dir, FirstTokenFile)
	created, err := EnsureFirst(store, out)
	if err != nil || !created {
		t.Fatalf("EnsureFirst = %v, %v", created, err)
	}
	if m := mode(t, out); m != 0o600 {
		t.Errorf("token file mode %04o, want 0600", m)
	}
	if m := mode(t, store); m != 0o600 {
		t.Errorf("store mode %04o, want 0600", m)
	}
	tok, err := ReadTokenFile(out)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Open(store)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := tk.Verify(tok); !ok || e.Name != "default" || e.Role != RoleAdmin || e.Tenant != DefaultTenant {
		t.Fatalf("first token verifies as %+v %v", e, ok)
	}
	data, _ := os.ReadFile(store)
	if strings.Contains(string(data), strings.TrimPrefix(tok, Prefix)) {
		t.Error("store holds the first token's plaintext")
	}

	// Tokens exist: nothing to do, the file is left alone.
	before, _ := os.ReadFile(out)
	if created, err := EnsureFirst(store, out); err != nil || created {
		t.Errorf("second EnsureFirst = %v, %v", created, err)
	}
	if after, _ := os.ReadFile(out); string(after) != string(before) {
		t.Error("second EnsureFirst changed the token file")
	}

	// Empty store, stale token file: refuse to overwrite it.
	if err := tk.Revoke("default"); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureFirst(store, out); !errdefs.IsAlreadyExists(err) {
		t.Errorf("EnsureFirst over an existing token file: %v, want already exists", err)
	}
	if after, _ := os.ReadFile(out); string(after) != string(before) {
		t.Error("EnsureFirst overwrote the token file")
	}
	if len(tk.List()) != 0 {
		t.Error("a refused EnsureFirst left a token behind")
	}
}
