package sandbox

// Chains: memory images of layers, compaction, and removal that respects
// dependents. See package snapshot (chain.go) for the on-disk form.
//
// With Config.MemoryDir set (a tmpfs, for live branches), flat snapshots'
// images are copied there too on first use, and clones map that copy.
//
// A VMM maps one complete memory image copy-on-write. For a flat snapshot
// that is its own memory file; for a layer it is assembled once from the
// chain (the root's image, then each layer's pages in order) into
// DATA/cache/memory/<digest>, written to a temporary file, fsynced and
// renamed, then never written again: clones map it, and a diff branch of
// such a clone records the pages that differ from it. Later forks, and
// pool refills, find it there, so a chain head forks like a flat
// snapshot. Entries whose snapshot is gone are removed when the engine
// starts and when the snapshot is removed (VMMs that map one keep their
// pages: unlinking does not unmap).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"golang.org/x/sys/unix"
)

// memCache holds assembled memory images, one file per chain-head digest.
type memCache struct {
	dir string
	// hugePage is the page size of dir when it is on hugetlbfs, else 0.
	// hugetlbfs has no write(2): images are filled through a mapping, and
	// their stamps are kept in stampDir, on the data dir's file system.
	hugePage int64
	stampDir string
	mu       sync.Mutex
	// building serializes assembly per digest: concurrent forks of a new
	// head wait for one assembly instead of each doing it.
	building map[string]*sync.Mutex
}

// newMemCache opens the memory image cache in dir; hugeStampDir is where
// stamps go if dir is on hugetlbfs.
func newMemCache(dir, hugeStampDir string) (*memCache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("memory cache: %w", err)
	}
	c := &memCache{dir: dir, stampDir: dir, building: map[string]*sync.Mutex{}}
	huge, err := fsutil.HugePageSize(dir)
	if err != nil {
		return nil, fmt.Errorf("memory cache: %w", err)
	}
	if huge > 0 {
		if err := os.MkdirAll(hugeStampDir, 0o700); err != nil {
			return nil, fmt.Errorf("memory cache: %w", err)
		}
		c.hugePage, c.stampDir = huge, hugeStampDir
	}
	return c, nil
}

// stampPath is where the stamp of the image at path is recorded.
func (c *memCache) stampPath(path string) string {
	return filepath.Join(c.stampDir, filepath.Base(path)+imageStampSuffix)
}

// remove deletes an image and its stamp.
func (c *memCache) remove(path string) {
	os.Remove(path)
	os.Remove(c.stampPath(path))
}

// path is where the assembled image of a digest lives.
func (c *memCache) path(digest string) string {
	return filepath.Join(c.dir, strings.TrimPrefix(digest, "sha256:"))
}

func (c *memCache) lock(digest string) func() {
	c.mu.Lock()
	l := c.building[digest]
	if l == nil {
		l = &sync.Mutex{}
		c.building[digest] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// prune removes everything but the images of digests in keep, temporary
// files of interrupted assemblies included: only at start-up, when no
// assembly is in flight.
func (c *memCache) prune(keep map[string]bool, log func(msg string, args ...any)) {
	dirs := []string{c.dir}
	if c.stampDir != c.dir {
		dirs = append(dirs, c.stampDir)
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if keep["sha256:"+strings.TrimSuffix(e.Name(), imageStampSuffix)] {
				continue
			}
			if err := os.Remove(filepath.Join(dir, e.Name())); err == nil {
				log("removed an assembled memory image no snapshot uses", "file", e.Name())
			}
		}
	}
}

// intactChain resolves snap's chain (snap first, the root last) and
// checks every link with checkIntact.
func (e *Engine) intactChain(snap *snapshot.Snapshot) ([]*snapshot.Snapshot, error) {
	chain, err := e.store.Chain(snap)
	if err != nil {
		return nil, err
	}
	for _, c := range chain {
		if err := e.checkIntact(c); err != nil {
			if c != snap {
				err = fmt.Errorf("snapshot %q needs %q: %w", snap.Tag, c.Tag, err)
			}
			return nil, err
		}
	}
	return chain, nil
}

// memoryImage returns the complete memory image a clone of snap maps:
// its memory file, or for a layer the image assembled from its chain
// (built on first use). Every call checks that what the clone would map
// is what was committed: the snapshot's files and its ancestors' (their
// stamps, a stat each) and the assembled image's; see checkIntact.
func (e *Engine) memoryImage(snap *snapshot.Snapshot) (string, error) {
	if !snap.IsLayer() && e.cfg.MemoryDir == "" {
		if err := e.checkIntact(snap); err != nil {
			return "", err
		}
		return snap.Path(snapshot.MemoryFile), nil
	}
	// The chain is checked on every use, not only when assembling: a
	// layer whose ancestor is gone or replaced is refused even while its
	// image is cached. Reading a few small manifests is cheap.
	chain, err := e.intactChain(snap)
	if err != nil {
		return "", err
	}
	digest := snap.Digest()
	path := e.mem.path(digest)
	// Without the lock, only look: an assembly in flight renames its image
	// into place before it writes the stamp, so an image without one may
	// be a moment from whole. Only the holder of the lock removes one.
	if e.mem.imageChange(path) == "" {
		return path, nil
	}
	unlock := e.mem.lock(digest)
	defer unlock()
	if e.cachedImageOK(snap, path) {
		return path, nil // assembled while this call waited
	}
	start := time.Now()
	written, err := e.mem.assemble(chain, path)
	if err != nil {
		return "", fmt.Errorf("snapshot %q: assemble memory from its chain of %d: %w", snap.Tag, len(chain), err)
	}
	e.log.Info("assembled the memory image clones of a snapshot map", "tag", snap.Tag, "depth", len(chain)-1, "dir", e.mem.dir,
		"bytes", written, "took", time.Since(start).Round(time.Millisecond))
	return path, nil
}

// Why an assembled image cannot be used as it is (imageChange).
const (
	imageMissing = "missing"
	imageNoStamp = "no stamp"
)

// imageChange reports why the assembled image at path cannot be mapped
// as it is: imageMissing, imageNoStamp, or how it changed since its stamp
// was recorded; "" when it is whole. It only looks.
func (c *memCache) imageChange(path string) string {
	now, err := snapshot.StampOf(path)
	if err != nil {
		return imageMissing
	}
	want, err := c.readStamp(path)
	if err != nil {
		return imageNoStamp
	}
	return want.Diff(now)
}

// cachedImageOK reports whether the assembled image at path exists and is
// as assembled (its stamp, recorded next to it, matches). An image
// without a stamp (assembly interrupted between the two renames, or made
// by an older forkd) or one that changed is removed, and so are the VMMs
// pooled on it, to be assembled again from the chain, whose files were
// just checked: nothing is lost but the time to assemble, and VMMs that
// hold the old file keep only their own mapping of it. The caller holds
// the image's lock (memCache.lock), so no assembly of it is in flight.
func (e *Engine) cachedImageOK(snap *snapshot.Snapshot, path string) bool {
	switch change := e.mem.imageChange(path); change {
	case "":
		return true
	case imageMissing:
		return false
	case imageNoStamp:
		e.log.Warn("assembling a memory image again: it has no stamp", "tag", snap.Tag, "file", path)
	default:
		e.log.Error("the memory image clones of a snapshot map was written after it was assembled: assembling it again and discarding the VMMs pooled on it",
			"tag", snap.Tag, "file", path, "change", change)
		// In the background: this may run in that pool's own refill,
		// which DropPool waits for.
		go e.DropPool(e.life, snap.ID)
	}
	e.mem.remove(path)
	return false
}

// imageStampSuffix names the stamp of an assembled image: next to it, or
// in memCache.stampDir.
const imageStampSuffix = ".stamp"

func (c *memCache) readStamp(path string) (snapshot.FileStamp, error) {
	var st snapshot.FileStamp
	data, err := os.ReadFile(c.stampPath(path))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

// writeImageStamp records the stamp of an assembled image once it has its
// final name (a rename changes the ctime).
func (c *memCache) writeStamp(path string) error {
	st, err := snapshot.StampOf(path)
	if err != nil {
		return err
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(c.stampPath(path), data, 0o400)
}

// checkIntact refuses a snapshot whose files changed since they were
// committed (snapshot.CheckStamps). The first mismatch marks it failed
// for as long as the daemon runs (the change cannot be undone: a ctime
// is not set back), drops its pool (those VMMs map the changed file),
// and is logged; every later fork gets the same 409. An error that says
// nothing about the files (the stamps could not be read: EIO, EMFILE)
// fails this check only: the next one reads them again.
func (e *Engine) checkIntact(snap *snapshot.Snapshot) error {
	e.mu.Lock()
	reason, failed := e.tainted[snap.ID]
	e.mu.Unlock()
	if !failed {
		err := snap.CheckStamps()
		if err == nil {
			return nil
		}
		if !errdefs.IsFailedPrecondition(err) {
			return err
		}
		reason = err.Error()
		e.mu.Lock()
		e.tainted[snap.ID] = reason
		e.mu.Unlock()
		e.log.Error("a snapshot's files changed after it was committed: it is refused from now on", "tag", snap.Tag, "snapshot_id", snap.ID, "err", err)
		// In the background: this may run in that pool's own refill,
		// which DropPool waits for.
		go e.DropPool(e.life, snap.ID)
	}
	return fmt.Errorf("%s; a VMM or another process wrote it, so clones could start from memory nobody snapshotted: remove it (`forkd rmi %s`) and re-create it (`forkd snapshot create`) or re-import it (`forkd unpack`): %w",
		reason, snap.Tag, errdefs.ErrFailedPrecondition)
}

// SnapshotIntact reports whether snap's files are still the ones that
// were committed (nil), or why it cannot be forked (for listing its
// state as failed).
func (e *Engine) SnapshotIntact(snap *snapshot.Snapshot) error {
	return e.checkIntact(snap)
}

// assemble writes the memory of chain[0] (head first, root last) to path:
// a sparse copy of the root's memory file with each layer's pages put
// over it, root side first (a flat snapshot's chain is itself: a copy).
// It stages in a temporary file, fsyncs and renames, so path is either
// absent or complete.
func (c *memCache) assemble(chain []*snapshot.Snapshot, path string) (written int64, err error) {
	root := chain[len(chain)-1]
	size := root.Files[snapshot.MemoryFile].Size
	for _, layer := range chain[:len(chain)-1] {
		if got := layer.Files[snapshot.MemoryFile].Size; got != size {
			return 0, fmt.Errorf("layer %q holds %d bytes of memory, its chain %d: %w", layer.Tag, got, size, errdefs.ErrFailedPrecondition)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".assemble-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		tmp.Close()
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if c.hugePage > 0 {
		written, err = fillMapped(tmp, chain, size, c.hugePage)
	} else {
		written, err = fillSparse(tmp, chain, size)
	}
	if err != nil {
		return written, err
	}
	if err := tmp.Sync(); err != nil {
		return written, err
	}
	if err := tmp.Chmod(0o400); err != nil {
		return written, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return written, err
	}
	if err := c.writeStamp(path); err != nil {
		os.Remove(path)
		return written, err
	}
	return written, fsutil.SyncDir(filepath.Dir(path))
}

// fillSparse writes the chain's memory into dst with write(2): the root
// copied sparse, each layer's pages applied over it.
func fillSparse(dst *os.File, chain []*snapshot.Snapshot, size int64) (int64, error) {
	return fillChain(chain,
		func(base *os.File) (int64, error) { return fsutil.CopySparse(dst, base, size) },
		func(f *os.File, ix *memlayer.Index) (int64, error) { return memlayer.Apply(dst, f, ix) })
}

// fillMapped is fillSparse for a file on hugetlbfs, which has no
// write(2). The whole image is allocated first (fallocate), so a short
// huge page pool is a clear error now rather than a SIGBUS in a clone
// later, and every clone's read of a page finds the shared page instead of
// allocating its own; it is then filled through a shared mapping.
func fillMapped(dst *os.File, chain []*snapshot.Snapshot, size, hugePage int64) (int64, error) {
	if size%hugePage != 0 {
		return 0, fmt.Errorf("memory of %d bytes is not a whole number of the memory dir's %d-byte huge pages: use a guest memory size that is a multiple of %d MiB, or a memory dir on tmpfs: %w",
			size, hugePage, hugePage>>20, errdefs.ErrInvalidArgument)
	}
	if err := unix.Fallocate(int(dst.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return 0, fmt.Errorf("the memory dir on hugetlbfs has too few free huge pages for a %d MiB image (%d pages of %d KiB; see HugePages_Free in /proc/meminfo): raise /proc/sys/vm/nr_hugepages: %w",
				size>>20, size/hugePage, hugePage>>10, errdefs.ErrResourceExhausted)
		}
		return 0, fmt.Errorf("allocate %d bytes on hugetlbfs: %w", size, err)
	}
	mem, err := unix.Mmap(int(dst.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("map the image on hugetlbfs: %w", err)
	}
	defer unix.Munmap(mem)
	return fillChain(chain,
		func(base *os.File) (int64, error) { return fsutil.ReadSparseInto(mem, base) },
		func(f *os.File, ix *memlayer.Index) (int64, error) { return memlayer.ApplyMapped(mem, f, ix) })
}

// fillChain puts the root's memory file in place with copyRoot, then each
// layer's pages over it with apply, root side first. It returns the bytes
// written.
func fillChain(chain []*snapshot.Snapshot, copyRoot func(*os.File) (int64, error), apply func(*os.File, *memlayer.Index) (int64, error)) (int64, error) {
	root := chain[len(chain)-1]
	base, err := os.Open(root.Path(snapshot.MemoryFile))
	if err != nil {
		return 0, err
	}
	written, err := copyRoot(base)
	base.Close()
	if err != nil {
		return written, fmt.Errorf("copy %q: %w", root.Tag, err)
	}
	size := root.Files[snapshot.MemoryFile].Size
	for i := len(chain) - 2; i >= 0; i-- {
		n, err := applyLayer(chain[i], size, apply)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// applyLayer opens a layer's index and memory file, checks the index
// against the chain's memory size, and hands both to apply.
func applyLayer(layer *snapshot.Snapshot, size int64, apply func(*os.File, *memlayer.Index) (int64, error)) (int64, error) {
	ix, err := memlayer.ReadFile(layer.Path(snapshot.LayerIndexFile))
	if err != nil {
		return 0, fmt.Errorf("layer %q: %w", layer.Tag, err)
	}
	if int64(ix.MemorySize) != size {
		return 0, fmt.Errorf("layer %q: index for %d bytes, memory %d: %w", layer.Tag, ix.MemorySize, size, errdefs.ErrFailedPrecondition)
	}
	f, err := os.Open(layer.Path(snapshot.MemoryFile))
	if err != nil {
		return 0, fmt.Errorf("layer %q: %w", layer.Tag, err)
	}
	defer f.Close()
	n, err := apply(f, ix)
	if err != nil {
		return n, fmt.Errorf("layer %q: %w", layer.Tag, err)
	}
	return n, nil
}

// pruneMemoryCache drops, at start-up, the images whose snapshot is gone
// and what an interrupted assembly left.
func (e *Engine) pruneMemoryCache() {
	snaps, err := e.store.List()
	if err != nil && len(snaps) == 0 {
		return
	}
	keep := map[string]bool{}
	for _, s := range snaps {
		if s.IsLayer() || e.cfg.MemoryDir != "" {
			keep[s.Digest()] = true
		}
	}
	e.mem.prune(keep, e.log.Info)
}

// RemoveOptions say what happens to the layers that need a snapshot.
type RemoveOptions struct {
	// Cascade removes the dependents too, deepest first.
	Cascade bool
	// Force removes the snapshot alone; its dependents can no longer be
	// forked (they report the missing ancestor) until it is restored.
	Force bool
}

// RemoveSnapshotWith deletes a tag. A snapshot that layers depend on is
// refused (FailedPrecondition naming them) unless opts says otherwise.
// It returns every tag removed. Running children keep working: their VMMs
// hold their memory open.
func (e *Engine) RemoveSnapshotWith(ctx context.Context, tag string, opts RemoveOptions) (removed []string, err error) {
	defer func() {
		for _, t := range removed {
			e.emit(Event{Kind: EventSnapshotDeleted, Tag: t})
		}
	}()
	if forgot, err := e.forgetFailed(tag); forgot || err != nil {
		if err != nil {
			return nil, err
		}
		return []string{tag}, nil
	}
	// Held from the listing of the dependents to the last removal: a layer
	// committed on tag in between would be orphaned (see snapshot.ChainsLockFile).
	unlock, err := e.store.LockChains(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	deps, err := e.store.Dependents(tag)
	if err != nil {
		return nil, err
	}
	targets := []string{tag}
	if len(deps) > 0 {
		switch {
		case opts.Cascade:
			targets = append(deps, tag)
		case opts.Force:
		default:
			return nil, fmt.Errorf("snapshot %q is the base of %d layer(s): %s; remove them first, or remove them with it (cascade: `forkd rmi --cascade`, API ?cascade=true); force (`--force`, ?force=true) removes %q alone and leaves them unusable: %w",
				tag, len(deps), strings.Join(deps, ", "), tag, errdefs.ErrFailedPrecondition)
		}
	}
	if opts.Force {
		// The layers left behind must not fork from VMMs pooled while
		// their chain was whole.
		for _, d := range deps {
			if snap, err := e.store.Get(d); err == nil {
				e.DropPool(ctx, snap.ID)
			}
		}
	}
	var digests []string
	defer func() { e.dropMemoryImages(digests) }()
	for _, t := range targets {
		if snap, err := e.store.Get(t); err == nil {
			digests = append(digests, snap.Digest())
		}
		if err := e.RemoveSnapshot(ctx, t); err != nil && !errdefs.IsNotFound(err) {
			return removed, err
		}
		removed = append(removed, t)
	}
	return removed, nil
}

// dropMemoryImages removes the memory images of removed snapshots, unless
// a snapshot that remains has the same content (and so the same digest).
// VMMs mapping one keep their pages.
func (e *Engine) dropMemoryImages(digests []string) {
	if len(digests) == 0 {
		return
	}
	snaps, err := e.store.List()
	if err != nil && len(snaps) == 0 {
		return
	}
	inUse := map[string]bool{}
	for _, s := range snaps {
		inUse[s.Digest()] = true
	}
	for _, d := range digests {
		if !inUse[d] {
			e.mem.remove(e.mem.path(d))
		}
	}
}

// Compact writes a flat (parentless) copy of a snapshot under a new tag:
// its assembled memory and its device state. The copy forks exactly like
// the original and no longer needs any ancestor.
func (e *Engine) Compact(ctx context.Context, from, to string) (*snapshot.Snapshot, error) {
	return e.CompactFor(ctx, from, to, "")
}

// CompactFor is Compact for tenant, who will own the copy: its event is
// that tenant's to see.
func (e *Engine) CompactFor(ctx context.Context, from, to, tenant string) (*snapshot.Snapshot, error) {
	snap, err := e.compact(ctx, from, to)
	if err == nil {
		e.emit(Event{Kind: EventSnapshotCreated, Tag: to, Tenant: tenant, Reason: "compact"})
	}
	return snap, err
}

func (e *Engine) compact(ctx context.Context, from, to string) (*snapshot.Snapshot, error) {
	start := time.Now()
	snap, err := e.store.Get(from)
	if err != nil {
		return nil, err
	}
	if err := e.store.CheckFree(to); err != nil {
		return nil, err
	}
	mem, err := e.memoryImage(snap)
	if err != nil {
		return nil, err
	}
	st, err := e.store.Stage(to)
	if err != nil {
		return nil, err
	}
	defer st.Abort()
	if err := copyFileSparse(mem, st.Path(snapshot.MemoryFile), snap.Files[snapshot.MemoryFile].Size); err != nil {
		return nil, fmt.Errorf("compact %q: memory: %w", from, err)
	}
	if err := copyFileSparse(snap.Path(snapshot.StateFile), st.Path(snapshot.StateFile), snap.Files[snapshot.StateFile].Size); err != nil {
		return nil, fmt.Errorf("compact %q: state: %w", from, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := snap.Manifest
	m.ID, m.Created, m.Files = "", time.Time{}, nil
	m.Parent, m.Depth, m.CompactedFrom = nil, 0, from
	m.CreateMillis = time.Since(start).Milliseconds()
	return st.Commit(m)
}

// copyFileSparse copies size bytes of src to a new file dst, keeping holes.
func copyFileSparse(src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = fsutil.CopySparse(out, in, size)
	return errors.Join(err, out.Close())
}
