package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// What the daemon's data takes, and what can go (forkd system df, forkd
// system prune, forkd image rm).
//
// Sizes on disk are allocated bytes (st_blocks): memory files are sparse,
// and a layer's is mostly holes. Snapshots are never reclaimable: they are
// what users made, and only `forkd rmi` removes one. What prune may take:
//
//   - images no snapshot was taken from (with PruneOptions.Images);
//   - assembled memory images (the cache of chain heads, and of flat
//     snapshots with --memory-dir) whose snapshot is gone;
//   - OCI layers (the cache of images built with from) that no image
//     lists, counting the images the same prune removes (ociimage.Cache:
//     refused while a build is pulling);
//   - dead sandboxes' records (they hold no disk: their run directory went
//     with their VMM).
//
// Pooled VMMs and running sandboxes hold guest memory, not disk: their
// size is the guest memory they commit.

// Usage is one kind of thing on the daemon: how many, how many in use,
// their size and the part of it prune would free.
type Usage struct {
	Count, Active    int
	Bytes, Reclaim   int64
	reclaimableItems []string
}

// DiskUsage is Usage by kind.
type DiskUsage struct {
	Images, Snapshots, Layers, MemoryImages, Pools, Sandboxes Usage
	// OCILayers is the layer cache of images built with from: a layer an
	// image lists is active, one no image a snapshot uses lists is
	// reclaimable (prune --images frees it).
	OCILayers Usage
}

// allocated is the disk space a file takes (0 if it cannot be read).
func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// allocatedTree is the disk space the regular files under dir take.
func allocatedTree(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n += allocated(path)
		}
		return nil
	})
	return n
}

// snapshotBytes is the disk space of a snapshot's files.
func snapshotBytes(snap *snapshot.Snapshot) int64 {
	var n int64
	for name := range snap.Files {
		n += allocated(snap.Path(name))
	}
	return n
}

// imageUsers maps image digests to the tags of the snapshots taken from
// them.
func imageUsers(snaps []*snapshot.Snapshot) map[string][]string {
	users := map[string][]string{}
	for _, s := range snaps {
		users[s.Image.Digest] = append(users[s.Image.Digest], s.Tag)
	}
	return users
}

// memoryKeep is the set of snapshot digests whose assembled memory image
// the cache keeps (the rule pruneMemoryCache applies at start-up).
func (e *Engine) memoryKeep(snaps []*snapshot.Snapshot) map[string]bool {
	keep := map[string]bool{}
	for _, s := range snaps {
		if s.IsLayer() || e.cfg.MemoryDir != "" {
			keep[s.Digest()] = true
		}
	}
	return keep
}

// memoryImages is the usage of the memory image cache: an image whose
// digest keep lacks is reclaimable (listed in reclaimableItems).
func (e *Engine) memoryImages(keep map[string]bool) (all Usage) {
	entries, _ := os.ReadDir(e.mem.dir)
	for _, ent := range entries {
		name := ent.Name()
		if !ent.Type().IsRegular() || strings.HasSuffix(name, imageStampSuffix) || strings.HasPrefix(name, ".") {
			continue
		}
		n := allocated(filepath.Join(e.mem.dir, name))
		all.Count++
		all.Bytes += n
		if keep["sha256:"+name] {
			all.Active++
			continue
		}
		all.Reclaim += n
		all.reclaimableItems = append(all.reclaimableItems, "sha256:"+name)
	}
	return all
}

func (e *Engine) layerCache() ociimage.Cache {
	return ociimage.Cache{Dir: image.LayerCacheDir(e.cfg.DataDir)}
}

// layersOf is the set of OCI layer digests imgs list.
func layersOf(imgs []*image.Image) map[string]bool {
	set := map[string]bool{}
	for _, img := range imgs {
		if img.From != nil {
			for _, d := range img.From.Layers {
				set[d] = true
			}
		}
		for _, s := range img.Steps {
			if s.Layer != "" {
				set[s.Layer] = true
			}
		}
	}
	return set
}

// ociLayers is the usage of the OCI layer cache: a layer one of all lists
// is active; one none of kept lists is reclaimable (listed in
// reclaimableItems).
func (e *Engine) ociLayers(all, kept []*image.Image) (u Usage, err error) {
	cached, err := e.layerCache().List()
	if err != nil {
		return u, fmt.Errorf("OCI layer cache: %w", err)
	}
	active, keep := layersOf(all), layersOf(kept)
	for _, l := range cached {
		u.Count++
		u.Bytes += l.Bytes
		if active[l.Digest] {
			u.Active++
		}
		if !keep[l.Digest] {
			u.Reclaim += l.Bytes
			u.reclaimableItems = append(u.reclaimableItems, l.Digest)
		}
	}
	return u, nil
}

// DiskUsage reports what the daemon's data directory (and memory
// directory) holds, and its pools and sandboxes.
func (e *Engine) DiskUsage() (DiskUsage, error) {
	var du DiskUsage
	snaps, err := e.store.List()
	if err != nil && len(snaps) == 0 {
		return du, err
	}
	imgs, err := e.Images()
	if err != nil && len(imgs) == 0 {
		return du, err
	}
	users := imageUsers(snaps)
	var used []*image.Image
	for _, img := range imgs {
		n := allocatedTree(img.Dir)
		du.Images.Count++
		du.Images.Bytes += n
		if len(users[img.Digest]) > 0 {
			du.Images.Active++
			used = append(used, img)
		} else {
			du.Images.Reclaim += n
		}
	}
	if du.OCILayers, err = e.ociLayers(imgs, used); err != nil {
		return du, err
	}
	inUse := map[string]bool{} // snapshot ids with running sandboxes
	for _, sb := range e.List() {
		du.Sandboxes.Count++
		if sb.State() == apiv1.StateRunning {
			du.Sandboxes.Active++
			inUse[sb.SnapshotID] = true
			if sb.base != nil {
				du.Sandboxes.Bytes += int64(sb.base.MemoryMiB) << 20
			}
		}
	}
	for _, snap := range snaps {
		u := &du.Snapshots
		if snap.IsLayer() {
			u = &du.Layers
		}
		u.Count++
		u.Bytes += snapshotBytes(snap)
		pooled := e.PoolSize(snap.ID)
		if inUse[snap.ID] || pooled > 0 {
			u.Active++
		}
		du.Pools.Count += pooled
		du.Pools.Bytes += int64(pooled*snap.MemoryMiB) << 20
	}
	if du.Pools.Count > 0 {
		du.Pools.Active = du.Pools.Count
	}
	du.MemoryImages = e.memoryImages(e.memoryKeep(snaps))
	return du, nil
}

// imagesBusy refuses image removal while image builds or snapshot
// creations run: a creation boots an image it found before no snapshot
// recorded it.
func (e *Engine) imagesBusy(what string) error {
	e.mu.Lock()
	n := len(e.buildSem)
	e.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("%s: %d image builds or snapshot creations are running and may be using it; retry when they end (`forkd operation ls`): %w",
			what, n, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// RemoveImage deletes an image, named by digest, unique digest prefix or
// recipe (its newest image). An image a snapshot was taken from is
// refused (FailedPrecondition naming the snapshots): its children boot
// its kernel and root fs.
func (e *Engine) RemoveImage(ctx context.Context, ref string) (*image.Image, error) {
	img, err := image.Open(e.cfg.DataDir, ref)
	if err != nil {
		return nil, err
	}
	snaps, err := e.store.List()
	if err != nil && len(snaps) == 0 {
		return nil, err
	}
	if tags := imageUsers(snaps)[img.Digest]; len(tags) > 0 {
		return nil, fmt.Errorf("image %s (recipe %s) is used by snapshots %s: remove them first (`forkd rmi %s`): %w",
			img.Digest[:12], img.Recipe, strings.Join(tags, ", "), strings.Join(tags, " "), errdefs.ErrFailedPrecondition)
	}
	if err := e.imagesBusy("remove image " + img.Digest[:12]); err != nil {
		return nil, err
	}
	if err := image.Remove(e.cfg.DataDir, img.Digest); err != nil {
		return nil, err
	}
	e.log.Info("image removed", "image", img.Digest, "recipe", img.Recipe)
	return img, nil
}

// PruneOptions say what Prune removes besides dead sandboxes' records,
// orphaned memory images and unlisted OCI layers.
type PruneOptions struct {
	// Images removes the images no snapshot was taken from.
	Images bool
	// DryRun reports what would go and removes nothing.
	DryRun bool
}

// PruneResult is what Prune removed (or, in a dry run, would remove).
type PruneResult struct {
	Sandboxes    []string
	Images       []*image.Image
	MemoryImages []string
	// OCILayers are the digests of the cached OCI layers removed.
	OCILayers []string
	// Bytes is the disk space freed (or that would be).
	Bytes int64
	// Skipped says what the prune left for another time, and why.
	Skipped []string
}

// Prune forgets dead sandboxes, removes assembled memory images no
// snapshot needs, cached OCI layers no image lists, and with opts.Images
// the images no snapshot uses. Snapshots are never removed. The layers go
// first; while a build is pulling they are left (Skipped says so) and the
// rest goes on. A removal that fails ends the prune with what was done
// so far.
func (e *Engine) Prune(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	for _, sb := range e.List() {
		if sb.State() == apiv1.StateDead {
			res.Sandboxes = append(res.Sandboxes, sb.ID)
		}
	}
	snaps, err := e.store.List()
	if err != nil && len(snaps) == 0 {
		return res, err
	}
	if opts.Images {
		if err := e.imagesBusy("prune images"); err != nil {
			return res, err
		}
	}
	imgs, err := e.Images()
	if err != nil && len(imgs) == 0 {
		return res, err
	}
	kept := imgs
	if opts.Images {
		users := imageUsers(snaps)
		kept = nil
		for _, img := range imgs {
			if len(users[img.Digest]) == 0 {
				res.Images = append(res.Images, img)
			} else {
				kept = append(kept, img)
			}
		}
	}
	layers, err := e.ociLayers(imgs, kept)
	if err != nil {
		return res, err
	}
	mem := e.memoryImages(e.memoryKeep(snaps))
	res.MemoryImages = mem.reclaimableItems
	if opts.DryRun {
		for _, img := range res.Images {
			res.Bytes += allocatedTree(img.Dir)
		}
		res.Bytes += mem.Reclaim + layers.Reclaim
		res.OCILayers = layers.reclaimableItems
		return res, nil
	}
	gone, err := e.layerCache().Remove(layers.reclaimableItems)
	for _, l := range gone {
		res.OCILayers = append(res.OCILayers, l.Digest)
		res.Bytes += l.Bytes
	}
	if errors.Is(err, ociimage.ErrCacheBusy) {
		// A build pulling layers is no reason to keep dead sandboxes,
		// memory images and unused images: the layers wait.
		res.Skipped = append(res.Skipped, fmt.Sprintf("%d unused OCI layers: %v", len(layers.reclaimableItems), err))
	} else if err != nil {
		return res, fmt.Errorf("prune OCI layers: %w", err)
	}
	if len(res.Sandboxes) > 0 {
		forgotten, _ := e.Kill(ctx, res.Sandboxes) // one forgotten meanwhile is not an error
		res.Sandboxes = forgotten
	}
	removed := res.Images[:0]
	for _, img := range res.Images {
		n := allocatedTree(img.Dir)
		if err := image.Remove(e.cfg.DataDir, img.Digest); err != nil && !errdefs.IsNotFound(err) {
			res.Images = removed
			return res, fmt.Errorf("prune image %s: %w", img.Digest[:12], err)
		}
		res.Bytes += n
		removed = append(removed, img)
	}
	res.Images = removed
	for _, digest := range res.MemoryImages {
		path := e.mem.path(digest)
		n := allocated(path)
		unlock := e.mem.lock(digest) // not while a fork assembles it
		e.mem.remove(path)
		unlock()
		res.Bytes += n
	}
	return res, nil
}
