package snapshot

import (
	"os"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// commit writes a tiny snapshot (its files' contents make its digest) on
// parent (nil: flat).
func commit(t *testing.T, s *Store, tag, content string, parent *Snapshot) *Snapshot {
	t.Helper()
	st, err := s.Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{StateFile, MemoryFile} {
		if err := os.WriteFile(st.Path(f), []byte(content+f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := Manifest{MemoryMiB: 64}
	if parent != nil {
		m.Parent = &ParentRef{Tag: parent.Tag, Digest: parent.Digest()}
		m.Depth = parent.Depth + 1
	}
	snap, err := st.Commit(m)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestChainAndDependents(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := commit(t, s, "root", "r", nil)
	a := commit(t, s, "a", "a", root)
	b := commit(t, s, "b", "b", a)
	c := commit(t, s, "c", "c", root) // a sibling branch
	if root.FormatVersion != 1 || a.FormatVersion != 2 {
		t.Errorf("format versions: flat %d, layer %d; want 1 and 2", root.FormatVersion, a.FormatVersion)
	}

	chain, err := s.Chain(b)
	if err != nil || len(chain) != 3 || chain[1].Tag != "a" || chain[2].Tag != "root" {
		t.Fatalf("chain of b: %v %v", chain, err)
	}
	if got := s.Ancestors(b); strings.Join(got, ",") != "a,root" {
		t.Errorf("ancestors of b: %v", got)
	}
	deps, err := s.Dependents("root")
	if err != nil || strings.Join(deps, ",") != "b,a,c" {
		t.Errorf("dependents of root: %v %v (want deepest first, then by tag)", deps, err)
	}
	if deps, _ := s.Dependents("c"); len(deps) != 0 {
		t.Errorf("a leaf has dependents: %v", deps)
	}

	// The digest is the content: same files and parent, same digest,
	// whatever the tag or creation time; any change moves it.
	if d := commit(t, s, "b-again", "b", a).Digest(); d != b.Digest() {
		t.Errorf("same content, different digest: %s %s", d, b.Digest())
	}
	if b.Digest() == c.Digest() || !strings.HasPrefix(b.Digest(), "sha256:") {
		t.Errorf("digests: b %s c %s", b.Digest(), c.Digest())
	}

	// A replaced ancestor (the tag now holds other content) and a missing
	// one are FailedPrecondition naming the tag.
	if err := s.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Chain(b); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), "gone") {
		t.Errorf("missing ancestor: %v", err)
	}
	commit(t, s, "a", "other", root)
	if _, err := s.Chain(b); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "replaced") {
		t.Errorf("replaced ancestor: %v", err)
	}
	if deps, _ := s.Dependents("a"); len(deps) != 0 {
		t.Errorf("the new a has b as a dependent: %v", deps)
	}

	// Depth limit.
	cur := root
	for i := 0; i <= MaxChainDepth; i++ {
		cur = commit(t, s, "d"+strings.Repeat("x", i+1), "d"+string(rune('a'+i)), cur)
	}
	if _, err := s.Chain(cur); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "deeper") {
		t.Errorf("chain past the depth limit: %v", err)
	}
}

// TestLayerCommitChecksItsParent: a layer whose parent was removed or
// replaced while it was staged is not committed, and its tag stays free.
func TestLayerCommitChecksItsParent(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stageOn := func(parent *Snapshot) (*Staging, Manifest) {
		st, err := s.Stage("layer")
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(st.Path(MemoryFile), []byte("pages"), 0o600)
		return st, Manifest{Parent: &ParentRef{Tag: parent.Tag, Digest: parent.Digest()}, Depth: 1}
	}
	for _, c := range []struct {
		name, want string
		change     func()
	}{
		{"removed", `parent "base" was removed while it was written`, func() { s.Remove("base") }},
		{"replaced", `parent "base" was replaced while it was written`, func() { s.Remove("base"); commit(t, s, "base", "other", nil) }},
	} {
		base := commit(t, s, "base", "base", nil)
		st, m := stageOn(base)
		c.change()
		_, err := st.Commit(m)
		st.Abort()
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: commit = %v", c.name, err)
		}
		if _, err := s.Get("layer"); !errdefs.IsNotFound(err) {
			t.Errorf("%s: the layer's tag exists: %v", c.name, err)
		}
		s.Remove("base")
	}
	base := commit(t, s, "base", "base", nil)
	st, m := stageOn(base)
	if _, err := st.Commit(m); err != nil {
		t.Fatalf("layer on a parent still there: %v", err)
	}
}
