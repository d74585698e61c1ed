// Package snapshot is forkd's snapshot store: one directory per tag under
// DATA/snapshots, each holding a versioned JSON manifest and the files the
// VMM needs to restore (device state and the memory image).
//
// A snapshot is created in a staging directory, every file is fsynced and
// hashed once, the manifest is written last, and the directory is renamed to
// its tag. A crash at any point leaves either no tag or a complete one;
// leftover staging directories are removed when the store opens. Files of a
// committed snapshot are never written again: children map the memory image
// copy-on-write.
package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// FormatVersion is the newest manifest.json format this forkd reads;
// readers refuse newer ones. Flat snapshots are written as version 1 (any
// forkd reads them); layers as version 2, so that a forkd from before
// chains refuses them instead of restoring a layer's partial memory as if
// it were complete.
const FormatVersion = 2

// formatFor is the manifest version a snapshot is written with.
func formatFor(m *Manifest) int {
	if m.Parent != nil {
		return 2
	}
	return 1
}

// File names inside a snapshot directory.
const (
	ManifestFile = "manifest.json"
	StateFile    = "vmstate"
	MemoryFile   = "memory"
	// LayerIndexFile lists the pages a layer's MemoryFile holds (package
	// memlayer); only layers (Manifest.Parent set) have it.
	LayerIndexFile = "memory.index"
)

// Manifest describes one snapshot.
type Manifest struct {
	FormatVersion int       `json:"format_version"`
	Tag           string    `json:"tag"`
	ID            string    `json:"id"` // random, unique per snapshot (tags can be reused after rmi)
	Created       time.Time `json:"created"`
	Image         ImageRef  `json:"image"`
	VMM           VMMRef    `json:"vmm"`
	MemoryMiB     int       `json:"memory_mib"`
	VCPUs         int       `json:"vcpus"`
	// CPUMillicores is the default CPU limit of its sandboxes (the
	// recipe's cpus; 0: one CPU per vCPU plus half a CPU for the VMM).
	CPUMillicores int64   `json:"cpu_millicores,omitempty"`
	Python        Python  `json:"python"`
	Network       Network `json:"network"`
	// Files maps a file name in the snapshot directory to its size and
	// SHA-256, computed once at creation.
	Files map[string]FileEntry `json:"files"`
	// CreateMillis is how long the snapshot took to create (boot + warm + save).
	CreateMillis int64 `json:"create_ms"`
	// Branch is set for a snapshot taken of a running sandbox (BRANCH).
	Branch *BranchRef `json:"branch,omitempty"`
	// Parent is set for a layer (a diff branch): its MemoryFile holds only
	// the pages the sandbox wrote, and its memory is the parent's with
	// those pages put over it. See chain.go.
	Parent *ParentRef `json:"parent,omitempty"`
	// Depth is the number of layers from this snapshot down to a
	// self-contained one: 0 for a flat snapshot, parent's + 1 for a layer.
	Depth int `json:"depth,omitempty"`
	// CompactedFrom names the chain head a flat snapshot was compacted from.
	CompactedFrom string `json:"compacted_from,omitempty"`
}

// BranchRef records where a branched snapshot came from.
type BranchRef struct {
	SandboxID      string `json:"sandbox_id"`
	FromTag        string `json:"from_tag"`
	FromSnapshotID string `json:"from_snapshot_id"`
	Mode           string `json:"mode"`
	PauseMicros    int64  `json:"pause_us"`
	BytesWritten   int64  `json:"bytes_written"`
}

// ImageRef names the guest image a snapshot was taken from.
type ImageRef struct {
	Digest        string `json:"digest"`
	Recipe        string `json:"recipe"`
	RecipeDigest  string `json:"recipe_digest"`
	KernelVersion string `json:"kernel_version"`
	// Paths of the image files (content-addressed, immutable).
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Rootfs string `json:"rootfs"`
	// KernelArgs the template booted with; children must match.
	KernelArgs []string `json:"kernel_args,omitempty"`
}

// VMMRef records which VMM wrote the snapshot; restores need the same.
type VMMRef struct {
	Kind    string `json:"kind"`
	Version string `json:"version"`
	Accel   string `json:"accel"`
}

// Python says whether a persistent session is running in the snapshot.
type Python struct {
	Enabled bool   `json:"enabled"`
	Warm    string `json:"warm,omitempty"`
	// Rehearse is what pooled children run in a throwaway copy of their
	// session before hand-out (recipe.Python.Rehearse).
	Rehearse string `json:"rehearse,omitempty"`
}

// Network is the guest side of the per-sandbox network, identical in every
// child of the snapshot.
type Network struct {
	GuestMAC  string `json:"guest_mac,omitempty"`
	GuestIP   string `json:"guest_ip,omitempty"`
	GatewayIP string `json:"gateway_ip,omitempty"`
	// Policy is what the snapshot's children may reach unless their fork
	// says otherwise; nil: the daemon's default.
	Policy *egress.Policy `json:"policy,omitempty"`
}

// FileEntry is one file of a snapshot.
type FileEntry struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Snapshot is a committed snapshot on disk.
type Snapshot struct {
	Manifest
	Dir string `json:"dir"`
}

// Path returns the absolute path of a file of the snapshot.
func (s *Snapshot) Path(name string) string { return filepath.Join(s.Dir, name) }

// Store is the snapshot directory tree. Its methods are safe for concurrent
// use by one process: each operation is a rename or a read.
type Store struct {
	root string
}

// Open opens (creating if needed) the store at DATA/snapshots and removes
// staging and trash directories left by a crash.
func Open(dataDir string) (*Store, error) {
	root := filepath.Join(dataDir, "snapshots")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot store %s: %w", root, err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".staging-") || strings.HasPrefix(e.Name(), ".trash-") {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	return &Store{root: root}, nil
}

// Root is the directory holding one subdirectory per tag.
func (s *Store) Root() string { return s.root }

// ChainsLockFile (DATA/snapshots/.chains.lock) is held by whatever changes
// which snapshot stands on which: a layer's commit (its parent must still
// be there as it renames into place), a removal (no layer may be committed
// on a snapshot between the listing of its dependents and its removal) and
// an archive import (the ancestors it reuses must stay). It is a flock, so
// an engine run by `forkd bench` beside the daemon takes it too.
const ChainsLockFile = ".chains.lock"

// chainsLockWait bounds a wait for the chains lock: its holders rename
// directories and list manifests, nothing slower.
const chainsLockWait = time.Minute

// LockChains takes the chains lock of the store at root (DATA/snapshots);
// unlock releases it.
func LockChains(ctx context.Context, root string) (unlock func(), err error) {
	return fsutil.LockFile(ctx, filepath.Join(root, ChainsLockFile), "another snapshot commit, removal or import")
}

// LockChains takes the store's chains lock (see ChainsLockFile).
func (s *Store) LockChains(ctx context.Context) (unlock func(), err error) {
	return LockChains(ctx, s.root)
}

// Staging is a snapshot being created. Write its files into Dir, then Commit
// or Abort. Abort after Commit is a no-op, so `defer st.Abort()` is safe.
type Staging struct {
	store *Store
	tag   string
	Dir   string
	done  bool
}

// CheckFree reports whether a snapshot could be created under tag: valid,
// outside the reserved namespace (ValidateNewTag) and not taken. Callers
// that must refuse early (before streaming a response) use it; Stage
// checks the same.
func (s *Store) CheckFree(tag string) error {
	if err := ValidateNewTag(tag); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(s.root, tag)); err == nil {
		return fmt.Errorf("snapshot %q already exists; remove it first with `forkd rmi %s` or choose another tag: %w", tag, tag, errdefs.ErrAlreadyExists)
	}
	return nil
}

// Stage starts a snapshot for tag. The tag must be valid, not reserved and
// not exist yet.
func (s *Store) Stage(tag string) (*Staging, error) {
	if err := s.CheckFree(tag); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(s.root, ".staging-"+tag+"-")
	if err != nil {
		return nil, fmt.Errorf("stage snapshot %q: %w", tag, err)
	}
	return &Staging{store: s, tag: tag, Dir: dir}, nil
}

// Path returns a file path inside the staging directory.
func (st *Staging) Path(name string) string { return filepath.Join(st.Dir, name) }

// Commit fsyncs and hashes every file in the staging directory, writes the
// manifest (tag, format version, files) and renames the directory to the
// tag. On error nothing is left under the tag.
func (st *Staging) Commit(m Manifest) (*Snapshot, error) {
	if st.done {
		return nil, fmt.Errorf("staging for %q already finished: %w", st.tag, errdefs.ErrFailedPrecondition)
	}
	m.FormatVersion = formatFor(&m)
	m.Tag = st.tag
	if m.ID == "" {
		m.ID = NewID()
	}
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	m.Files = map[string]FileEntry{}
	entries, err := os.ReadDir(st.Dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == ManifestFile || e.Name() == StampFile {
			continue
		}
		p := st.Path(e.Name())
		if err := fsutil.SyncFile(p); err != nil {
			return nil, fmt.Errorf("fsync %s: %w", p, err)
		}
		size, sum, err := fsutil.HashFile(p)
		if err != nil {
			return nil, err
		}
		// Committed files are immutable; make accidental writes fail.
		if err := os.Chmod(p, 0o400); err != nil {
			return nil, err
		}
		m.Files[e.Name()] = FileEntry{Size: size, SHA256: sum}
		names = append(names, e.Name())
	}
	// After the chmod (which changes the ctime), before the manifest
	// makes the snapshot whole: see stamp.go.
	if err := WriteStamps(st.Dir, names); err != nil {
		return nil, fmt.Errorf("record file stamps: %w", err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(st.Path(ManifestFile), append(data, '\n'), 0o400); err != nil {
		return nil, fmt.Errorf("write manifest: %w", err)
	}
	final := filepath.Join(st.store.root, st.tag)
	if m.Parent != nil {
		ctx, cancel := context.WithTimeout(context.Background(), chainsLockWait)
		unlock, err := st.store.LockChains(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		defer unlock()
		if err := st.store.checkParent(st.tag, m.Parent); err != nil {
			return nil, err
		}
	}
	// rename(2) onto an existing non-empty directory fails, so a tag created
	// concurrently is never replaced.
	if err := os.Rename(st.Dir, final); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, os.ErrExist) || isNotEmpty(err) {
			return nil, fmt.Errorf("snapshot %q already exists: %w", st.tag, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("commit snapshot %q: %w", st.tag, err)
	}
	st.done = true
	if err := fsutil.SyncDir(st.store.root); err != nil {
		return nil, err
	}
	return &Snapshot{Manifest: m, Dir: final}, nil
}

// checkParent fails unless the parent a layer names is in the store with
// the digest it recorded. Called with the chains lock held, just before
// the layer is renamed into place: the parent may have been removed or
// replaced while the layer was written.
func (s *Store) checkParent(tag string, parent *ParentRef) error {
	_, now, err := s.parent(parent)
	switch {
	case errdefs.IsNotFound(err):
		return fmt.Errorf("snapshot %q: its parent %q was removed while it was written; nothing was created: %w", tag, parent.Tag, errdefs.ErrFailedPrecondition)
	case err != nil:
		return fmt.Errorf("snapshot %q: parent %q: %w", tag, parent.Tag, err)
	case now != "":
		return fmt.Errorf("snapshot %q: its parent %q was replaced while it was written (digest %s, now %s); nothing was created: %w",
			tag, parent.Tag, shortDigest(parent.Digest), shortDigest(now), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Abort removes the staging directory unless Commit succeeded.
func (st *Staging) Abort() {
	if st.done {
		return
	}
	st.done = true
	os.RemoveAll(st.Dir)
}

// Get reads the snapshot for tag. An unknown tag is NotFound and the error
// lists the tags that exist.
func (s *Store) Get(tag string) (*Snapshot, error) {
	if err := ValidateTag(tag); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.root, tag)
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, s.notFound(tag)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", tag, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("snapshot %q: manifest %s is corrupt (%v); remove it with `forkd rmi %s`: %w", tag, filepath.Join(dir, ManifestFile), err, tag, errdefs.ErrFailedPrecondition)
	}
	if m.FormatVersion > FormatVersion {
		return nil, fmt.Errorf("snapshot %q has manifest format %d, this forkd reads up to %d; upgrade forkd: %w", tag, m.FormatVersion, FormatVersion, errdefs.ErrFailedPrecondition)
	}
	return &Snapshot{Manifest: m, Dir: dir}, nil
}

func (s *Store) notFound(tag string) error {
	tags, _ := s.Tags()
	known := "none yet; create one with `forkd snapshot create --tag TAG --recipe minimal`"
	if len(tags) > 0 {
		known = strings.Join(tags, ", ")
	}
	return fmt.Errorf("no snapshot tagged %q (existing tags: %s): %w", tag, known, errdefs.ErrNotFound)
}

// Tags lists committed tags, sorted.
func (s *Store) Tags() ([]string, error) {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return nil, err
	}
	var tags []string
	for _, e := range entries {
		if e.IsDir() && ValidateTag(e.Name()) == nil {
			if _, err := os.Stat(filepath.Join(s.root, e.Name(), ManifestFile)); err == nil {
				tags = append(tags, e.Name())
			}
		}
	}
	sort.Strings(tags)
	return tags, nil
}

// List returns every committed snapshot, sorted by tag. Unreadable
// snapshots are skipped with their error joined into the result error.
func (s *Store) List() ([]*Snapshot, error) {
	tags, err := s.Tags()
	if err != nil {
		return nil, err
	}
	var out []*Snapshot
	var errs []error
	for _, t := range tags {
		snap, err := s.Get(t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, snap)
	}
	return out, errors.Join(errs...)
}

// Remove deletes a snapshot. The directory is first renamed away so the tag
// disappears atomically, then its files are removed.
func (s *Store) Remove(tag string) error {
	if _, err := s.Get(tag); err != nil {
		return err
	}
	trash := filepath.Join(s.root, ".trash-"+tag+"-"+NewID())
	if err := os.Rename(filepath.Join(s.root, tag), trash); err != nil {
		return fmt.Errorf("remove snapshot %q: %w", tag, err)
	}
	if err := fsutil.SyncDir(s.root); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// Verify re-hashes the files of a snapshot against its manifest.
func (s *Snapshot) Verify() error {
	for name, want := range s.Files {
		size, sum, err := fsutil.HashFile(s.Path(name))
		if err != nil {
			return fmt.Errorf("snapshot %q file %s: %w", s.Tag, name, err)
		}
		if size != want.Size || sum != want.SHA256 {
			return fmt.Errorf("snapshot %q file %s changed since creation (size %d sha256 %s, manifest %d %s): %w",
				s.Tag, name, size, sum, want.Size, want.SHA256, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// NewID returns 12 random hex characters.
func NewID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func isNotEmpty(err error) bool {
	var le *os.LinkError
	return errors.As(err, &le) && strings.Contains(le.Err.Error(), "not empty")
}
