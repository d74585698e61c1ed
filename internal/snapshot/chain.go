package snapshot

// Chains of layers. A diff branch is stored as a layer: the pages the
// sandbox wrote (MemoryFile, sparse, at their offsets), their index
// (LayerIndexFile) and the device state, plus a Manifest.Parent naming the
// snapshot the sandbox was forked from by tag and by content digest. The
// parent may itself be a layer, down to a self-contained snapshot (the
// root). A layer costs the disk only what the sandbox wrote; the memory a
// VMM maps is assembled from the chain once (package sandbox caches it by
// digest), so forks from a chain head cost what forks from a flat
// snapshot cost.
//
// The digest pins the whole chain: it covers the snapshot's files (their
// SHA-256, computed once at commit or import) and its parent's digest, so
// a parent replaced under the same tag, or an ancestor whose manifest
// changed, no longer matches, and the chain is refused with a clear error
// instead of restoring memory that was never written together.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// MaxChainDepth bounds how many layers a chain may stack: each one is a
// file read when the head is assembled, and a deep chain is better
// compacted (forkd snapshot compact).
const MaxChainDepth = 16

// ParentRef names a layer's parent.
type ParentRef struct {
	Tag    string `json:"tag"`
	Digest string `json:"digest"`
}

// Digest is the snapshot's content digest: SHA-256 over its files' names,
// sizes and digests and its parent's digest, as "sha256:HEX". The manifest
// itself is not covered (its tag, times and statistics may differ between
// copies of the same content, such as an unpacked archive).
func (s *Snapshot) Digest() string {
	names := make([]string, 0, len(s.Files))
	for n := range s.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	fmt.Fprintf(h, "forkd-snapshot-digest-v1\n")
	for _, n := range names {
		fmt.Fprintf(h, "file %q %d %s\n", n, s.Files[n].Size, s.Files[n].SHA256)
	}
	if s.Parent != nil {
		fmt.Fprintf(h, "parent %s\n", s.Parent.Digest)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// IsLayer reports whether the snapshot needs its parent.
func (s *Snapshot) IsLayer() bool { return s.Parent != nil }

// Chain returns the snapshot and its ancestors, head first, root last. A
// missing ancestor, or one whose digest is not the one its child recorded
// (the tag was removed and reused, or its files changed), is a
// FailedPrecondition naming it and how to repair the chain.
func (s *Store) Chain(head *Snapshot) ([]*Snapshot, error) {
	chain := []*Snapshot{head}
	for cur := head; cur.Parent != nil; {
		if len(chain) > MaxChainDepth {
			return nil, fmt.Errorf("snapshot %q: chain deeper than %d layers: %w", head.Tag, MaxChainDepth, errdefs.ErrFailedPrecondition)
		}
		p, now, err := s.parent(cur.Parent)
		switch {
		case errdefs.IsNotFound(err):
			return nil, fmt.Errorf("snapshot %q needs %q (%s), its ancestor, which is gone: unpack an archive of %q to restore it, or remove %q: %w",
				head.Tag, cur.Parent.Tag, shortDigest(cur.Parent.Digest), head.Tag, head.Tag, errdefs.ErrFailedPrecondition)
		case err != nil:
			return nil, fmt.Errorf("snapshot %q: ancestor %q: %w", head.Tag, cur.Parent.Tag, err)
		case now != "":
			return nil, fmt.Errorf("snapshot %q needs %q with digest %s, but %q now has %s (it was replaced or altered): restore the original, or remove %q: %w",
				head.Tag, cur.Parent.Tag, shortDigest(cur.Parent.Digest), p.Tag, shortDigest(now), head.Tag, errdefs.ErrFailedPrecondition)
		}
		chain = append(chain, p)
		cur = p
	}
	return chain, nil
}

// parent reads the snapshot ref names. now is its digest when that is
// not the one ref recorded (the tag was removed and reused, or its files
// changed), "" when it is; a missing parent is NotFound.
func (s *Store) parent(ref *ParentRef) (p *Snapshot, now string, err error) {
	p, err = s.Get(ref.Tag)
	if err != nil {
		return nil, "", err
	}
	if d := p.Digest(); d != ref.Digest {
		return p, d, nil
	}
	return p, "", nil
}

// Dependents returns the tags whose chains go through tag (children,
// grandchildren, ...), deepest first, so that removing them in order never
// leaves a layer without its parent.
func (s *Store) Dependents(tag string) ([]string, error) {
	snap, err := s.Get(tag)
	if err != nil {
		return nil, err
	}
	all, err := s.List()
	if err != nil && len(all) == 0 {
		return nil, err
	}
	children := map[string][]*Snapshot{} // parent digest -> layers on it
	for _, c := range all {
		if c.Parent != nil {
			children[c.Parent.Digest] = append(children[c.Parent.Digest], c)
		}
	}
	type item struct {
		tag   string
		depth int
	}
	var out []item
	var walk func(s *Snapshot, depth int)
	walk = func(s *Snapshot, depth int) {
		if depth > MaxChainDepth+1 {
			return
		}
		for _, c := range children[s.Digest()] {
			if c.Parent.Tag != s.Tag {
				continue // the same content under another tag is not this one's child
			}
			out = append(out, item{c.Tag, depth})
			walk(c, depth+1)
		}
	}
	walk(snap, 1)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].depth != out[j].depth {
			return out[i].depth > out[j].depth
		}
		return out[i].tag < out[j].tag
	})
	tags := make([]string, len(out))
	for i, it := range out {
		tags[i] = it.tag
	}
	return tags, nil
}

// Ancestors returns the tags of a snapshot's chain above it: parent first,
// root last. A broken chain yields the ancestors up to the break.
func (s *Store) Ancestors(snap *Snapshot) []string {
	var out []string
	for cur := snap; cur.Parent != nil && len(out) <= MaxChainDepth; {
		out = append(out, cur.Parent.Tag)
		p, err := s.Get(cur.Parent.Tag)
		if err != nil || p.Digest() != cur.Parent.Digest {
			break
		}
		cur = p
	}
	return out
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return "sha256:" + d
}
