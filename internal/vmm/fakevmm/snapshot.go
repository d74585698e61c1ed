package fakevmm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Snapshot stops the guest, writes the snapshot and lets the guest run
// again (or ends the machine, with StopAfter). The state file is written
// last, so a snapshot whose state file exists is complete; every file is
// staged, fsynced and renamed into place.
//
// Guest memory goes where the machine's kind has it:
//   - booted with a memory file (a template): the file itself, mapped
//     shared, is synced and reported as the result's MemoryFile. Only a
//     full snapshot with StopAfter is allowed: a template that ran on
//     would change the pages its children have not copied yet.
//   - booted without one: a full snapshot writes the pages with data to
//     spec.MemoryFile (a sparse file).
//   - restored (a clone): spec.MemoryFile receives the clone's memory
//     file with the pages the guest wrote put over it, or, for a diff
//     with Layer, only those pages (a sparse layer). PageIndexFile, when
//     set, lists them (package memlayer).
func (m *Machine) Snapshot(ctx context.Context, spec vmm.SnapshotSpec) (vmm.SnapshotResult, error) {
	v := m.v
	start := time.Now()
	if err := checkSnapshotSpec(v.cfg.ID, spec); err != nil {
		return vmm.SnapshotResult{}, err
	}
	v.ctl.Lock()
	defer v.ctl.Unlock()
	prev, err := v.stopVCPU("snapshot")
	if err != nil {
		return vmm.SnapshotResult{}, err
	}
	v.mu.Lock()
	v.busy++ // the guest is stopped; this holds its memory
	v.mu.Unlock()
	res, err := v.writeSnapshot(ctx, spec)
	res.Paused = time.Since(start)
	v.leave()
	switch {
	case err == nil && spec.StopAfter:
		v.exit(nil)
	case prev == stateRunning:
		v.run()
	}
	if err != nil {
		return vmm.SnapshotResult{}, fmt.Errorf("fakevmm %s: snapshot: %w", v.cfg.ID, err)
	}
	v.log("fakevmm: %s snapshot to %s", spec.Type, spec.StateFile)
	res.Duration = time.Since(start)
	return res, nil
}

func checkSnapshotSpec(id string, spec vmm.SnapshotSpec) error {
	switch spec.Type {
	case vmm.SnapshotFull, vmm.SnapshotDiff:
	case vmm.SnapshotLive:
		return fmt.Errorf("fakevmm %s: live snapshots are not offered; take a full or diff one: %w", id, errdefs.ErrNotImplemented)
	default:
		return fmt.Errorf("fakevmm %s: snapshot type %q: %w", id, spec.Type, errdefs.ErrInvalidArgument)
	}
	if spec.StateFile == "" {
		return fmt.Errorf("fakevmm %s: snapshot needs a state file: %w", id, errdefs.ErrInvalidArgument)
	}
	if spec.Layer && (spec.Type != vmm.SnapshotDiff || spec.PageIndexFile == "") {
		return fmt.Errorf("fakevmm %s: a layer is a diff snapshot with a page index file: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// writeSnapshot writes the files of spec; the caller holds the memory
// with the guest stopped.
func (v *vm) writeSnapshot(ctx context.Context, spec vmm.SnapshotSpec) (vmm.SnapshotResult, error) {
	res := vmm.SnapshotResult{StateFile: spec.StateFile, MemoryFile: spec.MemoryFile}
	size := memBytes(v.cfg)
	dirty := v.dirtyPages()
	res.DirtyPages = int64(len(dirty))
	var err error
	switch {
	case v.shared || v.memFile == nil:
		if spec.Type != vmm.SnapshotFull {
			return res, fmt.Errorf("diff snapshots are of restored machines; take a full one: %w", errdefs.ErrFailedPrecondition)
		}
		if v.shared {
			if !spec.StopAfter {
				return res, fmt.Errorf("memory is shared with %s, which children map: set StopAfter: %w", v.cfg.MemoryFile, errdefs.ErrFailedPrecondition)
			}
			res.MemoryFile = v.cfg.MemoryFile
			err = syncShared(v.mem, v.memFile)
			break
		}
		if spec.MemoryFile == "" {
			return res, fmt.Errorf("a machine booted without a memory file needs SnapshotSpec.MemoryFile: %w", errdefs.ErrInvalidArgument)
		}
		dirty = dataPages(v.mem)
		res.DirtyPages = int64(len(dirty))
		res.BytesWritten, err = stageFile(spec.MemoryFile, func(f *os.File) (int64, error) {
			if err := f.Truncate(size); err != nil {
				return 0, err
			}
			return writePages(f, v.mem, dirty)
		})
	default:
		if spec.MemoryFile == "" {
			return res, fmt.Errorf("a restored machine's snapshot needs SnapshotSpec.MemoryFile: %w", errdefs.ErrInvalidArgument)
		}
		res.BytesWritten, err = stageFile(spec.MemoryFile, func(f *os.File) (int64, error) {
			if spec.Layer {
				if err := f.Truncate(size); err != nil {
					return 0, err
				}
				return writePages(f, v.mem, dirty)
			}
			base, err := fsutil.CopySparse(f, v.memFile, size)
			if err != nil {
				return 0, fmt.Errorf("copy %s: %w", v.cfg.MemoryFile, err)
			}
			n, err := writePages(f, v.mem, dirty)
			return base + n, err
		})
		if err == nil && spec.PageIndexFile != "" {
			b := memlayer.Builder{PageSize: pageSize, MemorySize: uint64(size)}
			for _, p := range dirty {
				b.Add(uint64(p), 1)
			}
			if err = memlayer.WriteFile(spec.PageIndexFile, b.Index()); err == nil {
				res.PageIndexFile = spec.PageIndexFile
			}
		}
	}
	if err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, context.Cause(ctx)
	}
	n, err := writeState(spec.StateFile, v.cfg, size)
	res.BytesWritten += n
	return res, err
}

// syncShared makes a shared mapping's writes durable in its file.
func syncShared(mem []byte, f *os.File) error {
	if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
		return fmt.Errorf("msync: %w", err)
	}
	return f.Sync()
}

// dataPages lists the pages of mem that are not all zeros.
func dataPages(mem []byte) []int64 {
	var pages []int64
	for off := 0; off < len(mem); off += pageSize {
		if !fsutil.IsZero(mem[off : off+pageSize]) {
			pages = append(pages, int64(off/pageSize))
		}
	}
	return pages
}

// writePages writes the listed pages (ascending) of mem to f at their
// offsets, a run of adjacent pages at a time; it returns the bytes
// written.
func writePages(f *os.File, mem []byte, pages []int64) (int64, error) {
	var written int64
	for i := 0; i < len(pages); {
		j := i + 1
		for j < len(pages) && pages[j] == pages[j-1]+1 {
			j++
		}
		off, end := pages[i]*pageSize, (pages[j-1]+1)*pageSize
		n, err := f.WriteAt(mem[off:end], off)
		written += int64(n)
		if err != nil {
			return written, err
		}
		i = j
	}
	return written, nil
}

// stageFile writes path through fill on a temporary file in its
// directory, then fsyncs it, renames it into place and fsyncs the
// directory. It returns what fill returns.
func stageFile(path string, fill func(*os.File) (int64, error)) (n int64, err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if n, err = fill(tmp); err != nil {
		return n, fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return n, err
	}
	if err = tmp.Close(); err != nil {
		return n, err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return n, err
	}
	return n, fsutil.SyncDir(dir)
}
