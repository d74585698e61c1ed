package pack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// addSnapshot commits a snapshot tagged tag in dataDir that boots the
// image of the snapshot tagged from. With layer, it is a layer on from,
// stored the way a diff branch stores one: a sparse memory file as large
// as from's holding only the pages the "guest" wrote (a run of random
// pages, a page equal to the root's first page, a zeroed page that is in
// the index but a hole in the file), their index (memory.index) and a
// device state. Without, it is a flat snapshot with other memory than
// from's. seed makes the content differ between calls.
func addSnapshot(t testing.TB, dataDir, from, tag string, seed uint64, layer bool) *snapshot.Snapshot {
	t.Helper()
	store, err := snapshot.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	parent, err := store.Get(from)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := store.Chain(parent)
	if err != nil {
		t.Fatal(err)
	}
	root := chain[len(chain)-1]
	memSize := root.Files[snapshot.MemoryFile].Size
	pages := uint64(memSize / pageSize)
	st, err := store.Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	page := func() []byte {
		b := make([]byte, pageSize)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	mf, err := os.Create(st.Path(snapshot.MemoryFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := mf.Truncate(memSize); err != nil {
		t.Fatal(err)
	}
	ix := memlayer.Builder{PageSize: pageSize, MemorySize: uint64(memSize)}
	write := func(p uint64, data []byte) {
		if _, err := mf.WriteAt(data, int64(p)*pageSize); err != nil {
			t.Fatal(err)
		}
		ix.Add(p, uint64(len(data)/pageSize))
	}
	run := pages/3 + seed%16*8
	for i := uint64(0); i < 8; i++ {
		write(run+i, page())
	}
	rootFirst := make([]byte, pageSize)
	rf, err := os.Open(root.Path(snapshot.MemoryFile))
	if err != nil {
		t.Fatal(err)
	}
	rf.ReadAt(rootFirst, 0)
	rf.Close()
	write(pages/2+seed%16, rootFirst) // the same bytes as a page of the root
	ix.Add(pages-2, 1)                // zeroed by the guest: a hole
	mf.Close()
	if err := os.WriteFile(st.Path(snapshot.StateFile), []byte(fmt.Sprintf("device state of %s, seed %d\n", tag, seed)), 0o600); err != nil {
		t.Fatal(err)
	}
	m := parent.Manifest
	m.ID, m.Created, m.Files, m.Parent, m.Depth = "", time.Time{}, nil, nil, 0
	if layer {
		if err := memlayer.WriteFile(st.Path(snapshot.LayerIndexFile), ix.Index()); err != nil {
			t.Fatal(err)
		}
		m.Parent = &snapshot.ParentRef{Tag: parent.Tag, Digest: parent.Digest()}
		m.Depth = parent.Depth + 1
		m.Branch = &snapshot.BranchRef{SandboxID: "sb-test", FromTag: parent.Tag, FromSnapshotID: parent.ID, Mode: "diff"}
	}
	snap, err := st.Commit(m)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// makeChain builds a data directory with the chain base ← l1 ← l2.
func makeChain(t testing.TB, memSize int64) (string, []*snapshot.Snapshot) {
	t.Helper()
	dir, _ := makeDataDir(t, "base", memSize)
	base := mustGetT(t, dir, "base")
	l1 := addSnapshot(t, dir, "base", "l1", 1, true)
	l2 := addSnapshot(t, dir, "l1", "l2", 2, true)
	return dir, []*snapshot.Snapshot{base, l1, l2}
}

func mustGetT(t testing.TB, dataDir, tag string) *snapshot.Snapshot {
	t.Helper()
	s, err := readSnapshot(dataDir, tag)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func unpackBytes(dst string, archive []byte, opts UnpackOptions) (*snapshot.Snapshot, UnpackStats, error) {
	return Unpack(context.Background(), dst, bytes.NewReader(archive), opts)
}

// archiveManifest decodes an archive's forkd-archive.json.
func archiveManifest(t testing.TB, archive []byte) *Manifest {
	t.Helper()
	var m Manifest
	if err := json.Unmarshal(decode(t, archive)[0].data, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

// checkUnpacked checks that dst holds the snapshots of want (root first)
// under their tags (the head's under headTag if set): the same files and
// digests with new IDs, every file's bytes verified, and a chain the store
// accepts.
func checkUnpacked(t *testing.T, dst string, want []*snapshot.Snapshot, headTag string) {
	t.Helper()
	store, err := snapshot.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	var got []*snapshot.Snapshot
	for i, w := range want {
		tag := w.Tag
		if i == len(want)-1 && headTag != "" {
			tag = headTag
		}
		s, err := store.Get(tag)
		if err != nil {
			t.Fatal(err)
		}
		if s.ID == w.ID || s.Digest() != w.Digest() || s.Depth != w.Depth || len(s.Files) != len(w.Files) {
			t.Errorf("%s: id %s (source %s), digest %s (source %s), depth %d (source %d)", tag, s.ID, w.ID, s.Digest(), w.Digest(), s.Depth, w.Depth)
		}
		for name, e := range w.Files {
			if s.Files[name] != e {
				t.Errorf("%s/%s: %+v, source %+v", tag, name, s.Files[name], e)
			}
		}
		if (s.Parent == nil) != (w.Parent == nil) || (s.Parent != nil && *s.Parent != *w.Parent) {
			t.Errorf("%s: parent %+v, source %+v", tag, s.Parent, w.Parent)
		}
		if err := s.Verify(); err != nil {
			t.Error(err)
		}
		if !strings.HasPrefix(s.Image.Rootfs, filepath.Join(dst, "images")) {
			t.Errorf("%s: rootfs %s is not in %s", tag, s.Image.Rootfs, dst)
		}
		got = append(got, s)
	}
	chain, err := store.Chain(got[len(got)-1])
	if err != nil {
		t.Fatalf("chain of the unpacked head: %v", err)
	}
	if len(chain) != len(want) {
		t.Errorf("chain of %d, want %d", len(chain), len(want))
	}
	for i, s := range chain {
		if s.ID != got[len(got)-1-i].ID {
			t.Errorf("chain[%d] is %s (%s), want %s", i, s.Tag, s.ID, got[len(got)-1-i].Tag)
		}
	}
}

// snapIDs maps the tags of dataDir to their snapshot IDs.
func snapIDs(t *testing.T, dataDir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	snaps, err := localSnapshots(filepath.Join(dataDir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		out[s.Tag] = s.ID
	}
	return out
}

func TestChainRoundTrip(t *testing.T) {
	src, chain := makeChain(t, 64*mib)
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ParsePrivateKey(privPEM)
	pub, _ := ParsePublicKey(pubPEM)
	archive, pst := packBytes(t, src, "l2", PackOptions{SignKey: key})
	t.Logf("pack: %+v", pst)
	if !slices.Equal(pst.Snapshots, []string{"base", "l1", "l2"}) {
		t.Errorf("packed %v", pst.Snapshots)
	}
	if pst.Files != 3+2+3+3 {
		t.Errorf("packed %d files, want the image's 3, the base's 2 and 3 per layer", pst.Files)
	}
	// Each layer has a page equal to the root's first page: a copy.
	if pst.CopiedBytes < 5*pageSize+2*pageSize {
		t.Errorf("copied %d bytes", pst.CopiedBytes)
	}
	m := archiveManifest(t, archive)
	if m.FormatVersion != FormatVersion || len(m.Images) != 1 || len(m.Snapshots) != 3 || m.Head != chain[2].ID {
		t.Fatalf("archive manifest: version %d, %d images, %d snapshots, head %s", m.FormatVersion, len(m.Images), len(m.Snapshots), m.Head)
	}
	for i, s := range m.Snapshots {
		if s.ID != chain[i].ID || s.Manifest.Tag != chain[i].Tag || (i > 0 && s.Parent != chain[i-1].ID) {
			t.Errorf("archive snapshot %d: %s %q parent %q", i, s.ID, s.Manifest.Tag, s.Parent)
		}
	}
	// The layers' holes stay out of the archive.
	if pst.StoredBytes > 8*mib {
		t.Errorf("stored %d bytes", pst.StoredBytes)
	}

	dst := t.TempDir()
	head, ust, err := unpackBytes(dst, archive, UnpackOptions{VerifyKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unpack: %+v", ust)
	if head.Tag != "l2" || !ust.Verified || !slices.Equal(ust.Added, []string{"base", "l1", "l2"}) || len(ust.Reused)+len(ust.Replaced) != 0 ||
		len(ust.ImagesAdded) != 1 || ust.Files != pst.Files {
		t.Errorf("unpack: head %s, stats %+v", head.Tag, ust)
	}
	checkUnpacked(t, dst, chain, "")
	// The layers' memory stays sparse: a hole where the guest zeroed a page.
	for _, tag := range []string{"l1", "l2"} {
		r, blocks := ranges(t, filepath.Join(dst, "snapshots", tag, snapshot.MemoryFile))
		if blocks > 256<<10 {
			t.Errorf("%s: memory allocates %d bytes (%v)", tag, blocks, r)
		}
	}
	assertClean(t, dst, []string{"base", "l1", "l2"}, []string{chain[0].Image.Digest})

	// The middle of a chain packs with its ancestors only.
	mid, pst := packBytes(t, src, "l1", PackOptions{})
	if !slices.Equal(pst.Snapshots, []string{"base", "l1"}) || len(archiveManifest(t, mid).Snapshots) != 2 {
		t.Errorf("archive of l1 holds %v", pst.Snapshots)
	}
	// A flat snapshot still makes a version 1 archive.
	flat, pst := packBytes(t, src, "base", PackOptions{})
	if v := archiveManifest(t, flat).FormatVersion; v != 1 || !slices.Equal(pst.Snapshots, []string{"base"}) {
		t.Errorf("archive of a flat snapshot: version %d, %v", v, pst.Snapshots)
	}
}

// TestChainReuse: ancestors already here with the same content are
// reused, not rewritten, and a layer's pages copied from them are read from
// the copy here.
func TestChainReuse(t *testing.T) {
	src, chain := makeChain(t, 16*mib)
	full, _ := packBytes(t, src, "l2", PackOptions{})
	flat, _ := packBytes(t, src, "base", PackOptions{})
	slim, _ := packBytes(t, src, "l2", PackOptions{ExcludeImages: true})
	dst := t.TempDir()
	base, _, err := unpackBytes(dst, flat, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var before syscall.Stat_t
	syscall.Stat(filepath.Join(dst, "snapshots", "base", snapshot.MemoryFile), &before)

	head, st, err := unpackBytes(dst, full, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Reused, []string{"base"}) || !slices.Equal(st.Added, []string{"l1", "l2"}) || len(st.ImagesReused) != 1 || len(st.ImagesAdded) != 0 {
		t.Errorf("stats %+v", st)
	}
	var after syscall.Stat_t
	syscall.Stat(filepath.Join(dst, "snapshots", "base", snapshot.MemoryFile), &after)
	if got := mustGetT(t, dst, "base"); got.ID != base.ID || before.Ino != after.Ino {
		t.Errorf("the reused base was rewritten: id %s (was %s), inode %d (was %d)", got.ID, base.ID, after.Ino, before.Ino)
	}
	checkUnpacked(t, dst, chain, "")

	// The head's tag is taken now: refused without force, nothing changes.
	ids := snapIDs(t, dst)
	if _, _, err := unpackBytes(dst, full, UnpackOptions{}); !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), `"l2"`) {
		t.Errorf("unpack onto an existing head: %v", err)
	}
	if got := snapIDs(t, dst); !mapsEqual(got, ids) {
		t.Errorf("tags changed: %v, were %v", got, ids)
	}
	// Under another tag, both ancestors are reused; the slim archive reads
	// the image here.
	other, st, err := unpackBytes(dst, slim, UnpackOptions{Tag: "l2-again"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Reused, []string{"base", "l1"}) || !slices.Equal(st.Added, []string{"l2-again"}) || other.ID == head.ID {
		t.Errorf("stats %+v", st)
	}
	checkUnpacked(t, dst, chain, "l2-again")
	// Forced onto the head: replaced (same digest, new ID); the ancestors
	// are still reused, not rewritten.
	forced, st, err := unpackBytes(dst, full, UnpackOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.ReplacedID != head.ID || !slices.Equal(st.ReplacedIDs, []string{head.ID}) || !slices.Equal(st.Replaced, []string{"l2"}) ||
		!slices.Equal(st.Reused, []string{"base", "l1"}) || forced.ID == head.ID {
		t.Errorf("forced: %+v", st)
	}
	if got := snapIDs(t, dst); got["base"] != ids["base"] || got["l1"] != ids["l1"] || got["l2"] != forced.ID {
		t.Errorf("ids after a forced unpack: %v, were %v", got, ids)
	}
	// A tag that is an ancestor's cannot name the head.
	if _, _, err := unpackBytes(dst, full, UnpackOptions{Tag: "l1"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("head tagged like its ancestor: %v", err)
	}
	assertClean(t, dst, []string{"base", "l1", "l2", "l2-again"}, []string{chain[0].Image.Digest})
}

// TestChainConflict: an ancestor's tag here with other content is refused
// without force and names both digests; force replaces it unless local
// layers depend on it that the archive does not replace.
func TestChainConflict(t *testing.T) {
	src, chain := makeChain(t, 16*mib)
	// A base with the same image and other memory, to put under "base"
	// elsewhere.
	addSnapshot(t, src, "base", "other", 9, false)
	otherArchive, _ := packBytes(t, src, "other", PackOptions{})
	full, _ := packBytes(t, src, "l2", PackOptions{})
	digest := chain[0].Image.Digest

	newDst := func(t *testing.T) string {
		dst := t.TempDir()
		if _, _, err := unpackBytes(dst, otherArchive, UnpackOptions{Tag: "base"}); err != nil {
			t.Fatal(err)
		}
		return dst
	}

	t.Run("refused", func(t *testing.T) {
		dst := newDst(t)
		here := mustGetT(t, dst, "base")
		_, _, err := unpackBytes(dst, full, UnpackOptions{})
		if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), `"base"`) ||
			!strings.Contains(err.Error(), here.Digest()) || !strings.Contains(err.Error(), chain[0].Digest()) {
			t.Fatalf("conflicting ancestor: %v", err)
		}
		t.Log(err)
		assertClean(t, dst, []string{"base"}, []string{digest})
		if got := mustGetT(t, dst, "base"); got.ID != here.ID {
			t.Error("the base here changed")
		}
	})

	t.Run("forced", func(t *testing.T) {
		dst := newDst(t)
		here := mustGetT(t, dst, "base")
		_, st, err := unpackBytes(dst, full, UnpackOptions{Force: true})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(st.Replaced, []string{"base"}) || !slices.Equal(st.ReplacedIDs, []string{here.ID}) || st.ReplacedID != "" ||
			!slices.Equal(st.Added, []string{"l1", "l2"}) {
			t.Errorf("stats %+v", st)
		}
		checkUnpacked(t, dst, chain, "")
		assertClean(t, dst, []string{"base", "l1", "l2"}, []string{digest})
	})

	t.Run("forced, with a local layer on it", func(t *testing.T) {
		dst := newDst(t)
		addSnapshot(t, dst, "base", "mine", 5, true)
		ids := snapIDs(t, dst)
		_, _, err := unpackBytes(dst, full, UnpackOptions{Force: true})
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "mine") {
			t.Fatalf("replacing a base with a local layer: %v", err)
		}
		t.Log(err)
		assertClean(t, dst, []string{"base", "mine"}, []string{digest})
		if got := snapIDs(t, dst); !mapsEqual(got, ids) {
			t.Errorf("tags changed: %v, were %v", got, ids)
		}
	})

	t.Run("forced, with local layers the archive replaces", func(t *testing.T) {
		// Here: base' ← l1' (other content under the archive's tags).
		dst := newDst(t)
		addSnapshot(t, dst, "base", "l1", 5, true)
		ids := snapIDs(t, dst)
		var seen []string
		testHookCommit = func(tag string) error {
			// Every tag at every step has its whole chain.
			for have := range snapIDs(t, dst) {
				if _, err := readChain(dst, have); err != nil {
					t.Errorf("before committing %s: %v", tag, err)
				}
			}
			seen = append(seen, tag)
			return nil
		}
		defer func() { testHookCommit = nil }()
		_, st, err := unpackBytes(dst, full, UnpackOptions{Force: true})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(seen, []string{"base", "l1", "l2"}) {
			t.Errorf("committed %v, want root first", seen)
		}
		if !slices.Equal(st.Replaced, []string{"base", "l1"}) || !slices.Equal(st.Added, []string{"l2"}) ||
			!slices.Equal(st.ReplacedIDs, []string{ids["base"], ids["l1"]}) {
			t.Errorf("stats %+v", st)
		}
		checkUnpacked(t, dst, chain, "")
		assertClean(t, dst, []string{"base", "l1", "l2"}, []string{digest})
	})

	t.Run("rolled back", func(t *testing.T) {
		// A failure while committing the head puts back what the unpack
		// replaced, and removes what it added, images included.
		dst := newDst(t)
		addSnapshot(t, dst, "base", "l1", 5, true)
		ids := snapIDs(t, dst)
		testHookCommit = func(tag string) error {
			for have := range snapIDs(t, dst) {
				if _, err := readChain(dst, have); err != nil {
					t.Errorf("before committing %s: %v", tag, err)
				}
			}
			if tag == "l2" {
				return errors.New("disk on fire")
			}
			return nil
		}
		defer func() { testHookCommit = nil }()
		if _, _, err := unpackBytes(dst, full, UnpackOptions{Force: true}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("unpack with a failing commit: %v", err)
		}
		if got := snapIDs(t, dst); !mapsEqual(got, ids) {
			t.Errorf("after rollback: %v, were %v", got, ids)
		}
		assertClean(t, dst, []string{"base", "l1"}, []string{digest})
		for _, tag := range []string{"base", "l1"} {
			s := mustGetT(t, dst, tag)
			if err := s.Verify(); err != nil {
				t.Error(err)
			}
			if _, err := readChain(dst, tag); err != nil {
				t.Error(err)
			}
		}

		// Into an empty directory: nothing is left, not even the image.
		empty := t.TempDir()
		if _, _, err := unpackBytes(empty, full, UnpackOptions{}); err == nil {
			t.Fatal("unpacked")
		}
		assertClean(t, empty, nil, nil)
	})
}

// TestChainHostile: archives whose chain does not hold together are
// refused before anything appears.
func TestChainHostile(t *testing.T) {
	src, chain := makeChain(t, 16*mib)
	archive, _ := packBytes(t, src, "l2", PackOptions{})
	valid := decode(t, archive)
	edit := func(fn func(m *Manifest)) []byte { return encode(t, editManifest(t, valid, fn)) }
	zero := "sha256:" + strings.Repeat("0", 64)
	// setFile changes the recorded hash of a file of snapshot i, in its
	// manifest and in the file list, so that only the chain is wrong.
	setFile := func(m *Manifest, i int, name, sum string) {
		fe := m.Snapshots[i].Manifest.Files[name]
		fe.SHA256 = sum
		m.Snapshots[i].Manifest.Files[name] = fe
		for j := range m.Files {
			if m.Files[j].Path == snapshotFilePath(m.Snapshots[i].ID, name) {
				m.Files[j].SHA256 = sum
			}
		}
	}
	// A head whose index is garbage with a matching hash.
	badIndex := func() []byte {
		es := append([]entry(nil), valid...)
		var m Manifest
		json.Unmarshal(es[0].data, &m)
		path := snapshotFilePath(m.Snapshots[2].ID, snapshot.LayerIndexFile)
		for i := range es {
			if es[i].hdr.Name == path {
				data := bytes.Clone(es[i].data)
				data[len(data)-1] ^= 1 // the CRC
				es[i].data = data
				sum := sha256Hex(data)
				es = editManifest(t, es, func(m *Manifest) {
					setFile(m, 2, snapshot.LayerIndexFile, sum)
					for j := range m.Files {
						if m.Files[j].Path == path {
							m.Files[j].Extents = []Extent{{0, int64(len(data))}}
							m.Files[j].Copies = nil
						}
					}
				})
			}
		}
		return encode(t, es)
	}()
	cases := []struct {
		name, want string
		archive    []byte
	}{
		{"parent digest of a layer", "does not hold together", edit(func(m *Manifest) { m.Snapshots[1].Manifest.Parent.Digest = zero })},
		{"ancestor's content changed", "does not hold together", edit(func(m *Manifest) {
			// The base's device state claims another hash (bytes to match
			// could follow): l1 was not taken on that base.
			setFile(m, 0, snapshot.StateFile, strings.Repeat("1", 64))
		})},
		{"parent tag of a layer", "names its parent", edit(func(m *Manifest) { m.Snapshots[2].Manifest.Parent.Tag = "base" })},
		{"layer order", "is not an earlier snapshot", edit(func(m *Manifest) {
			m.Snapshots[1], m.Snapshots[2] = m.Snapshots[2], m.Snapshots[1]
			m.Head = m.Snapshots[2].ID
		})},
		{"root is a layer", "which the archive does not hold", edit(func(m *Manifest) {
			m.Snapshots[0].Manifest.Parent = &snapshot.ParentRef{Tag: "gone", Digest: zero}
		})},
		{"depth", "depth", edit(func(m *Manifest) { m.Snapshots[2].Manifest.Depth = 7 })},
		{"two snapshots with one tag", "names two snapshots", edit(func(m *Manifest) { m.Snapshots[2].Manifest.Tag = "base" })},
		{"a layer without its index", "has no memory.index", edit(func(m *Manifest) {
			path := snapshotFilePath(m.Snapshots[2].ID, snapshot.LayerIndexFile)
			delete(m.Snapshots[2].Manifest.Files, snapshot.LayerIndexFile)
			m.Files = slices.DeleteFunc(m.Files, func(f File) bool { return f.Path == path })
		})},
		{"a corrupt index", "memlayer", badIndex},
		{"version 1 with a chain", "holds one snapshot", edit(func(m *Manifest) { m.FormatVersion = 1 })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, pre := range []bool{false, true} {
				dst := t.TempDir()
				var keep, images []string
				if pre { // the root is here already: reuse must not change that
					flat, _ := packBytes(t, src, "base", PackOptions{})
					if _, _, err := unpackBytes(dst, flat, UnpackOptions{}); err != nil {
						t.Fatal(err)
					}
					keep, images = []string{"base"}, []string{chain[0].Image.Digest}
				}
				_, _, err := unpackBytes(dst, c.archive, UnpackOptions{Force: true})
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v, want InvalidArgument containing %q", err, c.want)
				}
				assertClean(t, dst, keep, images)
			}
			t.Log(c.want)
		})
	}
}

// TestPackBrokenChain: a layer whose ancestor is gone or replaced does not
// pack, and nothing is written.
func TestPackBrokenChain(t *testing.T) {
	src, _ := makeChain(t, 16*mib)
	store, err := snapshot.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	// Replaced: l1 under the same tag with other content.
	if err := store.Remove("l1"); err != nil {
		t.Fatal(err)
	}
	addSnapshot(t, src, "base", "l1", 11, true)
	_, err = Pack(context.Background(), src, "l2", &buf, PackOptions{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "replaced or altered") || buf.Len() != 0 {
		t.Errorf("pack over a replaced ancestor: %v (%d bytes written)", err, buf.Len())
	}
	// Gone.
	if err := store.Remove("l1"); err != nil {
		t.Fatal(err)
	}
	_, err = Pack(context.Background(), src, "l2", &buf, PackOptions{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "gone") || buf.Len() != 0 {
		t.Errorf("pack without an ancestor: %v (%d bytes written)", err, buf.Len())
	}
}

// TestUnpackVersion1Archive unpacks an archive written by the forkd before
// chains (testdata/v1-flat.forkd.tar.zst, a 1 MiB snapshot "base" made by
// makeDataDir and packed by that release's Pack).
func TestUnpackVersion1Archive(t *testing.T) {
	archive, err := os.ReadFile(filepath.Join("testdata", "v1-flat.forkd.tar.zst"))
	if err != nil {
		t.Fatal(err)
	}
	if v := archiveManifest(t, archive).FormatVersion; v != 1 {
		t.Fatalf("testdata archive has version %d", v)
	}
	dst := t.TempDir()
	snap, st, err := unpackBytes(dst, archive, UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Tag != "base" || snap.Parent != nil || !slices.Equal(st.Added, []string{"base"}) || len(st.ImagesAdded) != 1 {
		t.Errorf("unpacked %s, %+v", snap.Tag, st)
	}
	if err := mustGetT(t, dst, "base").Verify(); err != nil {
		t.Error(err)
	}
	// It packs again the same: version 1, the same files.
	again, _ := packBytes(t, dst, "base", PackOptions{})
	m1, m2 := archiveManifest(t, archive), archiveManifest(t, again)
	if m2.FormatVersion != 1 || len(m1.Files) != len(m2.Files) {
		t.Errorf("repacked: version %d, %d files (was %d)", m2.FormatVersion, len(m2.Files), len(m1.Files))
	}
	for i := range m1.Files {
		if m1.Files[i].SHA256 != m2.Files[i].SHA256 {
			t.Errorf("file %d: %s, was %s", i, m2.Files[i].SHA256, m1.Files[i].SHA256)
		}
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
