package snapshot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestValidateTag(t *testing.T) {
	for _, ok := range []string{"a", "py-pandas", "eval.v2", "x_1", strings.Repeat("a", 64)} {
		if err := ValidateTag(ok); err != nil {
			t.Errorf("ValidateTag(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", ".hidden", "A", "a/b", "..", "a b", strings.Repeat("a", 65), "ä"} {
		err := ValidateTag(bad)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), TagRule) {
			t.Errorf("ValidateTag(%q) = %v, want invalid argument stating the rule", bad, err)
		}
	}
}

func FuzzValidateTag(f *testing.F) {
	for _, s := range []string{"py-pandas", "../etc", "a/b", "", "x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tag string) {
		if ValidateTag(tag) != nil {
			return
		}
		// A valid tag must be a single, safe path element.
		if tag != filepath.Base(tag) || strings.ContainsAny(tag, "/\\\x00") || tag == "." || tag == ".." || strings.HasPrefix(tag, ".") {
			t.Fatalf("unsafe tag accepted: %q", tag)
		}
	})
}

func commitOne(t *testing.T, s *Store, tag string) *Snapshot {
	t.Helper()
	st, err := s.Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort()
	if err := os.WriteFile(st.Path(StateFile), []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(st.Path(MemoryFile), []byte("memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Commit(Manifest{MemoryMiB: 256, VCPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestStoreLifecycle(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	snap := commitOne(t, s, "base")
	if snap.Files[StateFile].Size != 5 || len(snap.Files[MemoryFile].SHA256) != 64 {
		t.Fatalf("files not recorded: %+v", snap.Files)
	}
	got, err := s.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != snap.ID || got.FormatVersion != 1 || got.Tag != "base" { // flat: version 1
		t.Fatalf("round trip mismatch: %+v vs %+v", got.Manifest, snap.Manifest)
	}
	if err := got.Verify(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stage("base"); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Stage(existing) = %v, want already exists", err)
	}
	_, err = s.Get("nope")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "base") {
		t.Fatalf("Get(unknown) = %v, want not found listing existing tags", err)
	}
	if err := s.Remove("base"); err != nil {
		t.Fatal(err)
	}
	if tags, _ := s.Tags(); len(tags) != 0 {
		t.Fatalf("tags after remove: %v", tags)
	}
}

func TestVerifyDetectsChange(t *testing.T) {
	s, _ := Open(t.TempDir())
	snap := commitOne(t, s, "v")
	p := snap.Path(MemoryFile)
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("MEMORY"), 0o600)
	if err := snap.Verify(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Verify after change = %v, want failed precondition", err)
	}
}

func TestAbortLeavesNoTagAndOpenCleansStaging(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	st, err := s.Stage("half")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(st.Path(MemoryFile), []byte("x"), 0o600)
	// Simulate a crash: the staging dir stays behind.
	if tags, _ := s.Tags(); len(tags) != 0 {
		t.Fatalf("staging visible as tag: %v", tags)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(st.Dir); !os.IsNotExist(err) {
		t.Fatalf("staging dir survived reopen: %v", err)
	}
	st2, _ := s.Stage("half")
	st2.Abort()
	if _, err := os.Stat(st2.Dir); !os.IsNotExist(err) {
		t.Fatal("Abort left the staging dir")
	}
}

func TestCorruptManifestIsClearError(t *testing.T) {
	s, _ := Open(t.TempDir())
	snap := commitOne(t, s, "c")
	p := snap.Path(ManifestFile)
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("{trunc"), 0o600)
	_, err := s.Get("c")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Get(corrupt) = %v", err)
	}
}

// TestReservedTagsRefused: no snapshot is staged under a tag of the
// reserved namespace; reading one (a fork by reference's) is fine.
func TestReservedTagsRefused(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tag := ReservedTagPrefix + "py-3.12-0123456789abcdef01234567"
	if ValidateTag(tag) != nil || !IsReservedTag(tag) || IsReservedTag("ref-x") || IsReservedTag("my-ref--x") {
		t.Fatal("IsReservedTag and ValidateTag disagree with the namespace")
	}
	for name, err := range map[string]error{"ValidateNewTag": ValidateNewTag(tag), "CheckFree": s.CheckFree(tag)} {
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "reserves") {
			t.Errorf("%s(%q): %v, want invalid argument naming the reserved namespace", name, tag, err)
		}
	}
	if st, err := s.Stage(tag); err == nil {
		st.Abort()
		t.Errorf("Stage(%q) succeeded", tag)
	}
	if err := ValidateNewTag("py-3.12"); err != nil {
		t.Errorf("an ordinary tag: %v", err)
	}
	if _, err := s.Get(tag); !errdefs.IsNotFound(err) {
		t.Errorf("Get of an absent reserved tag: %v, want not found", err)
	}
}
