package pack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
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

// commit writes the snapshot's manifest and renames the staging directory
// to the tag; with Force, an existing tag is swapped out atomically.
func (u *unpacker) commit() (*snapshot.Snapshot, error) {
	sm := u.head.Manifest
	sm.Tag = u.tag
	// A new ID: pools and sandboxes know snapshots by ID, and the same
	// archive may be unpacked under several tags.
	sm.ID = snapshot.NewID()
	imgDir := filepath.Join(u.imgRoot, sm.Image.Digest)
	for _, p := range []*string{&sm.Image.Kernel, &sm.Image.Initrd, &sm.Image.Rootfs} {
		if *p != "" {
			*p = filepath.Join(imgDir, filepath.Base(*p))
		}
	}
	data, err := json.MarshalIndent(sm, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(u.snapStage, snapshot.ManifestFile), append(data, '\n'), 0o400); err != nil {
		return nil, err
	}
	final := filepath.Join(u.snapRoot, u.tag)
	err = os.Rename(u.snapStage, final)
	if err != nil && isExist(err) {
		if !u.opts.Force {
			return nil, u.exists()
		}
		err = u.replace(final)
	}
	if err != nil {
		return nil, fmt.Errorf("commit snapshot %q: %w", u.tag, err)
	}
	u.committed = true
	if err := fsutil.SyncDir(u.snapRoot); err != nil {
		return nil, err
	}
	return &snapshot.Snapshot{Manifest: sm, Dir: final}, nil
}

// replace swaps the staging directory with the existing snapshot at final
// (renameat2 RENAME_EXCHANGE), then removes the old one. Where the file
// system cannot exchange, the old snapshot is renamed away first.
func (u *unpacker) replace(final string) error {
	if old, err := os.ReadFile(filepath.Join(final, snapshot.ManifestFile)); err == nil {
		var om snapshot.Manifest
		if json.Unmarshal(old, &om) == nil {
			u.stats.ReplacedID = om.ID
		}
	}
	err := unix.Renameat2(unix.AT_FDCWD, u.snapStage, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE)
	if err == nil {
		// The staging name now holds the old snapshot; rollback is not
		// needed, only its removal.
		old := u.snapStage
		u.snapStage = ""
		fsutil.SyncDir(u.snapRoot)
		return os.RemoveAll(old)
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	trash := filepath.Join(u.snapRoot, ".trash-"+u.tag+"-"+snapshot.NewID())
	if err := os.Rename(final, trash); err != nil {
		return err
	}
	if err := os.Rename(u.snapStage, final); err != nil {
		os.Rename(trash, final)
		return err
	}
	u.snapStage = ""
	fsutil.SyncDir(u.snapRoot)
	return os.RemoveAll(trash)
}

// rollback removes what a failed Unpack created.
func (u *unpacker) rollback() {
	if u.snapStage != "" && !u.committed {
		os.RemoveAll(u.snapStage)
	}
	for _, dir := range u.imgStages {
		os.RemoveAll(dir)
	}
	if u.committed {
		return
	}
	// Images published for a snapshot that then failed to commit.
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
