package pack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// publishImages moves the new images into place, each under the lock
// image builds of its digest take.
func (u *unpacker) publishImages() error {
	for _, img := range u.m.Images {
		stage, ok := u.imgStages[img.Digest]
		if !ok {
			continue
		}
		if err := writeFileSync(filepath.Join(stage, imageManifestName), img.Manifest, 0o444); err != nil {
			return err
		}
		if err := fsutil.SyncDir(stage); err != nil {
			return err
		}
		added, err := u.publishImage(img, stage)
		if err != nil {
			return err
		}
		if added {
			u.stats.ImagesAdded = append(u.stats.ImagesAdded, img.Digest)
		} else {
			u.stats.ImagesReused = append(u.stats.ImagesReused, img.Digest)
		}
	}
	return nil
}

func (u *unpacker) publishImage(img Image, stage string) (added bool, err error) {
	unlock, err := lockImage(u.ctx, u.imgRoot, img.Digest)
	if err != nil {
		return false, err
	}
	defer unlock()
	dst := filepath.Join(u.imgRoot, img.Digest)
	// Built or unpacked by someone else since prepare?
	if local, err := u.localImage(img); err != nil || local {
		return false, err
	}
	if err := os.Rename(stage, dst); err != nil {
		if isExist(err) {
			return false, fmt.Errorf("%s exists but holds no image; remove it: %w", dst, errdefs.ErrFailedPrecondition)
		}
		return false, err
	}
	delete(u.imgStages, img.Digest)
	u.published = append(u.published, dst)
	return true, fsutil.SyncDir(u.imgRoot)
}

// checkLayers runs after every byte was verified: the chain still holds
// together with the digests of the files as unpacked (each layer's parent
// digest is that of the snapshot before it, recomputed from the file
// hashes the bytes just matched), and the page index of each new layer
// decodes and covers exactly its memory file, so that a fork of the head
// can assemble its memory.
func (u *unpacker) checkLayers() error {
	for i, us := range u.snaps {
		sm := &us.s.Manifest
		if d := digestOf(sm); d != us.digest {
			return fmt.Errorf("snapshot %q: digest %s, planned %s: %w", us.tag, d, us.digest, errdefs.ErrInternal)
		}
		if i == 0 {
			continue
		}
		prev := u.snaps[i-1]
		if sm.Parent == nil || sm.Parent.Digest != prev.digest {
			return invalid("layer %q does not name %q with digest %s as its parent: the chain does not hold together", us.tag, prev.tag, prev.digest)
		}
		if us.action == actReuse {
			continue // here already, with this digest
		}
		mem := sm.Files[snapshot.MemoryFile].Size
		ixFile := sm.Files[snapshot.LayerIndexFile]
		// An index has at most one extent per two pages; refuse to read
		// one that claims more before reading it.
		if ixFile.Size > mem/(2*pageSize)*16+4096 {
			return invalid("layer %q: %s of %d bytes for %d bytes of memory", us.tag, snapshot.LayerIndexFile, ixFile.Size, mem)
		}
		ix, err := memlayer.ReadFile(filepath.Join(us.stage, snapshot.LayerIndexFile))
		if err != nil {
			return invalid("layer %q: %v", us.tag, err)
		}
		if int64(ix.MemorySize) != mem {
			return invalid("layer %q: %s is for %d bytes of memory, its memory file holds %d", us.tag, snapshot.LayerIndexFile, ix.MemorySize, mem)
		}
	}
	return nil
}

// commit publishes the chain, root first, so that every tag that appears
// has its ancestors: old layers that are replaced along with their parent
// are moved away first (deepest first), then each snapshot is reused
// (checked to be still the same), created by a rename, or replaced by an
// atomic exchange. What was replaced is removed only once all of it is in
// place; until then rollback can put it back.
func (u *unpacker) commit() (*snapshot.Snapshot, error) {
	u.commitStarted = true
	var first []*unpackSnap
	for _, us := range u.snaps {
		if us.moveFirst {
			first = append(first, us)
		}
	}
	sort.SliceStable(first, func(i, j int) bool { return first[i].old.Depth > first[j].old.Depth })
	for _, us := range first {
		trash := filepath.Join(u.snapRoot, ".trash-"+us.tag+"-"+snapshot.NewID())
		if err := os.Rename(filepath.Join(u.snapRoot, us.tag), trash); err != nil {
			return nil, fmt.Errorf("move snapshot %q aside to replace it: %w", us.tag, err)
		}
		us.moved = trash
	}
	if len(first) > 0 {
		if err := fsutil.SyncDir(u.snapRoot); err != nil {
			return nil, err
		}
	}
	for _, us := range u.snaps {
		if testHookCommit != nil {
			if err := testHookCommit(us.tag); err != nil {
				return nil, err
			}
		}
		if err := u.commitOne(us); err != nil {
			return nil, err
		}
	}
	if err := fsutil.SyncDir(u.snapRoot); err != nil {
		return nil, err
	}
	// All of it is in place: what was replaced can go.
	for _, us := range u.snaps {
		switch {
		case us.action == actReuse:
			u.stats.Reused = append(u.stats.Reused, us.tag)
		case us.action == actReplace:
			u.stats.Replaced = append(u.stats.Replaced, us.tag)
			if us.old != nil {
				u.stats.ReplacedIDs = append(u.stats.ReplacedIDs, us.old.ID)
				if us.head {
					u.stats.ReplacedID = us.old.ID
				}
			}
		default:
			u.stats.Added = append(u.stats.Added, us.tag)
		}
		if us.moved != "" {
			os.RemoveAll(us.moved) // a leftover .trash- or .staging- directory is removed at start
			us.moved = ""
		}
	}
	return u.snaps[len(u.snaps)-1].result, nil
}

// commitOne publishes one snapshot of the chain; its parent is in place.
func (u *unpacker) commitOne(us *unpackSnap) error {
	if us.action == actReuse {
		return u.reuse(us)
	}
	sm := us.s.Manifest
	sm.Tag = us.tag
	// A new ID: pools and sandboxes know snapshots by ID, and the same
	// archive may be unpacked under several tags.
	sm.ID = snapshot.NewID()
	imgDir := filepath.Join(u.imgRoot, sm.Image.Digest)
	for _, p := range []*string{&sm.Image.Kernel, &sm.Image.Initrd, &sm.Image.Rootfs} {
		if *p != "" {
			*p = filepath.Join(imgDir, filepath.Base(*p))
		}
	}
	if d := digestOf(&sm); d != us.digest {
		return fmt.Errorf("snapshot %q: manifest digest %s, archive %s: %w", us.tag, d, us.digest, errdefs.ErrInternal)
	}
	data, err := json.MarshalIndent(sm, "", "  ")
	if err != nil {
		return err
	}
	// Stamps of this host's files (times are local, so they are taken
	// here, never carried in the archive): forks then notice a file that
	// changed after the import, as for snapshots created here.
	names := make([]string, 0, len(sm.Files))
	for n := range sm.Files {
		names = append(names, n)
	}
	if err := snapshot.WriteStamps(us.stage, names); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(us.stage, snapshot.ManifestFile), append(data, '\n'), 0o400); err != nil {
		return err
	}
	final := filepath.Join(u.snapRoot, us.tag)
	us.result = &snapshot.Snapshot{Manifest: sm, Dir: final}
	if us.action == actAdd || us.moved != "" {
		err := os.Rename(us.stage, final)
		if err == nil {
			us.stage, us.committed = "", true
			return nil
		}
		if !isExist(err) {
			return fmt.Errorf("commit snapshot %q: %w", us.tag, err)
		}
		if us.moved != "" {
			return fmt.Errorf("snapshot %q was created while the archive was unpacked: %w", us.tag, errdefs.ErrAlreadyExists)
		}
		// Created since prepare: decide again.
		if err := u.classify(us); err != nil {
			return err
		}
		if us.action == actReuse {
			os.RemoveAll(us.stage)
			us.stage = ""
			return u.reuse(us)
		}
		if err := u.checkDependents(); err != nil {
			return err
		}
	}
	if err := u.replace(us, final); err != nil {
		return fmt.Errorf("commit snapshot %q: %w", us.tag, err)
	}
	return nil
}

// reuse checks that an ancestor reused from this host is still the one
// the archive's bytes were verified against.
func (u *unpacker) reuse(us *unpackSnap) error {
	old, err := readSnapshot(filepath.Dir(u.snapRoot), us.tag)
	if err != nil || old.Digest() != us.digest {
		return fmt.Errorf("snapshot %q, an ancestor of %q, was removed or replaced here while the archive was unpacked; unpack it again: %w",
			us.tag, u.tag, errdefs.ErrFailedPrecondition)
	}
	us.result = old
	return nil
}

// replace swaps the staging directory with the existing snapshot at final
// (renameat2 RENAME_EXCHANGE), so the tag never disappears; the old one
// stays at the staging name until the unpack is complete. Where the file
// system cannot exchange, the old snapshot is renamed away first.
func (u *unpacker) replace(us *unpackSnap, final string) error {
	if old, err := readSnapshot(filepath.Dir(u.snapRoot), us.tag); err == nil {
		us.old = old
	}
	err := unix.Renameat2(unix.AT_FDCWD, us.stage, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE)
	if err == nil {
		// The staging name now holds the old snapshot.
		us.moved, us.stage, us.committed = us.stage, "", true
		return nil
	}
	if errors.Is(err, unix.ENOENT) { // removed since prepare
		if err := os.Rename(us.stage, final); err != nil {
			return err
		}
		us.stage, us.committed = "", true
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	trash := filepath.Join(u.snapRoot, ".trash-"+us.tag+"-"+snapshot.NewID())
	if err := os.Rename(final, trash); err != nil {
		return err
	}
	if err := os.Rename(us.stage, final); err != nil {
		os.Rename(trash, final)
		return err
	}
	us.moved, us.stage, us.committed = trash, "", true
	return nil
}

// rollback removes what a failed Unpack created and puts back what it
// replaced: first the new snapshots come off their tags, head first (so no
// new layer is ever left without its parent), then the old ones return,
// root first.
func (u *unpacker) rollback() {
	for _, us := range u.snaps {
		if us.stage != "" {
			os.RemoveAll(us.stage)
			us.stage = ""
		}
	}
	for _, dir := range u.imgStages {
		os.RemoveAll(dir)
	}
	kept := false
	if u.commitStarted {
		for i := len(u.snaps) - 1; i >= 0; i-- {
			us := u.snaps[i]
			if !us.committed {
				continue
			}
			trash := filepath.Join(u.snapRoot, ".trash-"+us.tag+"-"+snapshot.NewID())
			if err := os.Rename(filepath.Join(u.snapRoot, us.tag), trash); err != nil {
				kept = true
				continue
			}
			us.committed = false
			os.RemoveAll(trash)
		}
		for _, us := range u.snaps {
			if us.moved != "" && os.Rename(us.moved, filepath.Join(u.snapRoot, us.tag)) == nil {
				us.moved = ""
			}
		}
		fsutil.SyncDir(u.snapRoot)
	}
	if kept {
		return // a snapshot of this unpack is still here, and needs its images
	}
	// Images published for snapshots that then failed to commit.
	for _, dst := range u.published {
		digest := filepath.Base(dst)
		unlock, err := lockImage(context.WithoutCancel(u.ctx), u.imgRoot, digest)
		if err != nil {
			continue
		}
		trash := filepath.Join(u.imgRoot, fmt.Sprintf(".staging-%d-rm-%s", os.Getpid(), digest[:12]))
		if os.Rename(dst, trash) == nil {
			fsutil.SyncDir(u.imgRoot)
			os.RemoveAll(trash)
		}
		unlock()
	}
}

func isExist(err error) bool {
	return errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTDIR)
}
