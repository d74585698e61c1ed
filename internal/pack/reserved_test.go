package pack

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestUnpackRefusesReservedTags: no archive creates a tag in the
// reserved namespace (snapshot.ReservedTagPrefix) unless the daemon asks
// for it as the head's tag (UnpackOptions.ReservedTag): not a tag the
// caller names, not the archive's own head tag, not an ancestor's.
func TestUnpackRefusesReservedTags(t *testing.T) {
	const reserved = snapshot.ReservedTagPrefix + "x-0123456789abcdef01234567"
	src, _ := makeDataDir(t, "base", 1<<20)
	flat, _ := packBytes(t, src, "base", PackOptions{})
	refused := func(what string, archive []byte, opts UnpackOptions) {
		t.Helper()
		dst := t.TempDir()
		_, _, err := unpackBytes(dst, archive, opts)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "reserves") {
			t.Errorf("%s: %v, want invalid argument naming the reserved namespace", what, err)
		}
		assertClean(t, dst, nil, nil)
	}
	refused("a reserved tag asked for", flat, UnpackOptions{Tag: reserved})
	headReserved := encode(t, editManifest(t, decode(t, flat), func(m *Manifest) { m.Snapshots[0].Manifest.Tag = reserved }))
	refused("an archive whose head is tagged in the namespace", headReserved, UnpackOptions{})
	// The daemon's fork by reference: the head under its reserved tag.
	dst := t.TempDir()
	snap, _, err := unpackBytes(dst, flat, UnpackOptions{Tag: reserved, ReservedTag: true})
	if err != nil || snap.Tag != reserved {
		t.Fatalf("unpack under a reserved tag the daemon asked for: %v %v", snap, err)
	}
	// ...which replaces only with ReplaceHead.
	if _, _, err := unpackBytes(dst, flat, UnpackOptions{Tag: reserved, ReservedTag: true}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("a second unpack under the held tag without ReplaceHead: %v, want already exists", err)
	}
	if _, st, err := unpackBytes(dst, flat, UnpackOptions{Tag: reserved, ReservedTag: true, ReplaceHead: true}); err != nil || len(st.Replaced) != 1 {
		t.Errorf("ReplaceHead: %v %+v, want the head replaced", err, st)
	}

	// A chain whose ancestor is tagged in the namespace: refused even
	// with ReservedTag (that is for the head alone), unless the ancestor
	// is here already with the same content.
	chainSrc, _ := makeChain(t, 1<<20)
	chain, _ := packBytes(t, chainSrc, "l1", PackOptions{})
	ancReserved := encode(t, editManifest(t, decode(t, chain), func(m *Manifest) {
		m.Snapshots[0].Manifest.Tag = reserved
		m.Snapshots[1].Manifest.Parent.Tag = reserved
		m.Snapshots[1].Manifest.Parent.Digest = digestOf(&m.Snapshots[0].Manifest)
	}))
	refused("an archive whose ancestor is tagged in the namespace", ancReserved, UnpackOptions{})
	refused("the same, with ReservedTag for the head", ancReserved, UnpackOptions{Tag: snapshot.ReservedTagPrefix + "head", ReservedTag: true})
}
