package firecracker

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// The per-child writable disk (Config.LayerMiB).
const (
	layerDrive = "layer"
	layerName  = "layer.img"
	// layerSuffix names a snapshot's copy of the layer, next to its
	// state file.
	layerSuffix = ".layer"
)

// Restore loads the snapshot into the prepared process and resumes the
// guest: the memory file mapped copy-on-write (File) or served by the
// page server (Uffd), the tap and vsock socket of this child in place of
// the template's, kvmclock advanced to now unless NoClockRealtime.
func (m *Machine) Restore(ctx context.Context) (vmm.RestoreTimings, error) {
	start := time.Now()
	spec := m.restore
	if s := m.getState(); spec == nil || s != stateStarted {
		return vmm.RestoreTimings{}, fmt.Errorf("firecracker %s: restore a machine that is %s (Prepare makes one to restore): %w", m.cfg.ID, s, errdefs.ErrFailedPrecondition)
	}
	state, err := m.stage(spec.StateFile, "snapshot.state")
	if err != nil {
		return vmm.RestoreTimings{}, err
	}
	load := snapshotLoad{
		SnapshotPath:    state,
		TrackDirtyPages: m.cfg.TrackDirtyPages,
		ResumeVM:        m.d.cfg.LayerMiB == 0, // the layer is swapped in first
		VsockOverride:   &vsockOverride{UDSPath: m.inner(vsockName)},
		ClockRealtime:   !m.d.cfg.NoClockRealtime,
	}
	if spec.MemoryBackend == vmm.MemoryBackendUffd {
		sock, err := m.stage(spec.UffdSocket, "uffd.sock")
		if err != nil {
			return vmm.RestoreTimings{}, err
		}
		load.MemBackend = memBackend{BackendType: "Uffd", BackendPath: sock}
	} else {
		mem, err := m.stage(spec.MemoryFile, "snapshot.mem")
		if err != nil {
			return vmm.RestoreTimings{}, err
		}
		load.MemBackend = memBackend{BackendType: "File", BackendPath: mem}
	}
	if n := m.cfg.Network; n != nil {
		load.NetworkOverrides = []networkOverride{{IfaceID: ifaceID, HostDevName: n.TapName}}
	}
	if err := m.api.put(ctx, "/snapshot/load", load); err != nil {
		return vmm.RestoreTimings{}, fmt.Errorf("firecracker %s: restore: %w%s", m.cfg.ID, err, m.exitDetail())
	}
	m.setState(statePaused)
	if !load.ResumeVM {
		if err := m.api.patch(ctx, "/drives/"+layerDrive, partialDrive{DriveID: layerDrive, PathOnHost: m.inner(layerName)}); err != nil {
			return vmm.RestoreTimings{}, fmt.Errorf("firecracker %s: restore: this child's layer: %w", m.cfg.ID, err)
		}
		if err := m.resume(ctx); err != nil {
			return vmm.RestoreTimings{}, err
		}
	}
	m.setState(stateRunning)
	d := time.Since(start)
	return vmm.RestoreTimings{Load: d, Total: d}, nil
}

// Pause stops the guest's vCPUs (PATCH /vm Paused).
func (m *Machine) Pause(ctx context.Context) error {
	if s := m.getState(); s != stateRunning {
		return fmt.Errorf("firecracker %s: pause a machine that is %s: %w", m.cfg.ID, s, errdefs.ErrFailedPrecondition)
	}
	if err := m.api.patch(ctx, "/vm", vmState{State: "Paused"}); err != nil {
		return err
	}
	m.setState(statePaused)
	return nil
}

// Resume lets a paused guest run again (PATCH /vm Resumed).
func (m *Machine) Resume(ctx context.Context) error {
	if s := m.getState(); s != statePaused {
		return fmt.Errorf("firecracker %s: resume a machine that is %s: %w", m.cfg.ID, s, errdefs.ErrFailedPrecondition)
	}
	return m.resume(ctx)
}

func (m *Machine) resume(ctx context.Context) error {
	if err := m.api.patch(ctx, "/vm", vmState{State: "Resumed"}); err != nil {
		return err
	}
	m.setState(stateRunning)
	return nil
}

// Snapshot pauses the guest, writes its state and memory (Full: all of
// it; Diff: the pages written since the last snapshot, needing
// TrackDirtyPages) and resumes it, or ends it with StopAfter. Memory goes
// to spec.MemoryFile, or to MachineConfig.MemoryFile when that is empty.
func (m *Machine) Snapshot(ctx context.Context, spec vmm.SnapshotSpec) (vmm.SnapshotResult, error) {
	start := time.Now()
	kind := map[vmm.SnapshotType]string{vmm.SnapshotFull: "Full", vmm.SnapshotDiff: "Diff"}[spec.Type]
	mem := spec.MemoryFile
	if mem == "" {
		mem = m.cfg.MemoryFile
	}
	switch {
	case spec.Type == vmm.SnapshotLive:
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: live snapshots: Firecracker pauses the guest for every snapshot; take a diff snapshot: %w", m.cfg.ID, errdefs.ErrNotImplemented)
	case kind == "":
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: snapshot type %q: %w", m.cfg.ID, spec.Type, errdefs.ErrInvalidArgument)
	case (spec.PageIndexFile != "" || spec.Layer) && (spec.Type != vmm.SnapshotDiff || m.restore == nil):
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: page index and layer files come with diff snapshots of a restored machine: %w", m.cfg.ID, errdefs.ErrInvalidArgument)
	case spec.Layer && spec.PageIndexFile == "":
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: a layer needs its page index file: %w", m.cfg.ID, errdefs.ErrInvalidArgument)
	case spec.Type == vmm.SnapshotDiff && m.restore != nil && !spec.Layer && m.restore.MemoryFile == "":
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: a complete diff image of a machine whose memory a page server serves: take a layer (its parent is the served chain): %w", m.cfg.ID, errdefs.ErrNotImplemented)
	case spec.Type == vmm.SnapshotDiff && !m.cfg.TrackDirtyPages:
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: a diff snapshot needs dirty page tracking from boot or restore (MachineConfig.TrackDirtyPages): %w", m.cfg.ID, errdefs.ErrFailedPrecondition)
	case spec.StateFile == "" || mem == "":
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: a snapshot needs a state file and a memory file: %w", m.cfg.ID, errdefs.ErrInvalidArgument)
	case spec.Type == vmm.SnapshotDiff && m.restore != nil && m.dirtyLost():
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: a full snapshot of this page-served machine reset Firecracker's dirty bitmap, so the pages written before it are unknown: branch it full: %w", m.cfg.ID, errdefs.ErrFailedPrecondition)
	}
	// A full snapshot of a restored machine that tracks dirty pages is a
	// Diff completed from its base after the guest resumes: the pause is a
	// diff's, not all of memory's.
	fullAsDiff := spec.Type == vmm.SnapshotFull && m.restore != nil && m.cfg.TrackDirtyPages && m.restore.MemoryFile != ""
	if fullAsDiff {
		kind = "Diff"
	}
	if err := m.Pause(ctx); err != nil {
		return vmm.SnapshotResult{}, err
	}
	paused := time.Now()
	res, err := m.writeSnapshot(ctx, kind, spec.StateFile, mem)
	if err == nil && m.d.cfg.LayerMiB > 0 {
		err = copyFile(m.hostPath("/"+layerName), spec.StateFile+layerSuffix)
	}
	if spec.StopAfter {
		m.Kill()
	} else if rerr := m.resume(ctx); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: snapshot: %w", m.cfg.ID, err)
	}
	res.Paused = time.Since(paused)
	if spec.Type == vmm.SnapshotFull && !fullAsDiff && m.restore != nil && m.cfg.TrackDirtyPages {
		m.mu.Lock()
		m.fullTaken = true // the bitmap restarted: see dirtyLost
		m.mu.Unlock()
	}
	if (spec.Type == vmm.SnapshotDiff && m.restore != nil) || fullAsDiff {
		// Off the pause: the guest runs again.
		if err := m.finishDiff(spec, &res); err != nil {
			return vmm.SnapshotResult{}, fmt.Errorf("firecracker %s: diff snapshot: %w", m.cfg.ID, err)
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// dirtyLost says a Full snapshot restarted Firecracker's dirty bitmap
// without the driver folding what it had marked: later diffs would miss
// the pages written before it.
func (m *Machine) dirtyLost() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fullTaken
}

// finishDiff turns the Diff memory file Firecracker wrote (the pages
// written since the restore or the previous snapshot) into what spec
// asks, relative to the memory the machine was restored from: a layer
// of every page written since the restore, or the complete image; with
// the page index of those pages.
func (m *Machine) finishDiff(spec vmm.SnapshotSpec, res *vmm.SnapshotResult) error {
	m.mu.Lock()
	if m.dirty == nil {
		m.dirty = newDirtySet(m.cfg.RunDir, uint64(m.cfg.MemoryMiB)<<20)
	}
	ds := m.dirty
	m.mu.Unlock()
	if err := ds.fold(res.MemoryFile); err != nil {
		return err
	}
	ix := ds.index()
	if spec.Layer {
		f, err := os.OpenFile(res.MemoryFile, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		err = ds.writeOver(f, ix)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	} else if err := ds.completeImage(res.MemoryFile, m.restore.MemoryFile, ix); err != nil {
		return err
	}
	if _, err := syncFile(res.MemoryFile); err != nil {
		return err
	}
	res.DirtyPages = int64(ix.Pages())
	if spec.PageIndexFile != "" {
		if err := memlayer.WriteFile(spec.PageIndexFile, ix); err != nil {
			return err
		}
		res.PageIndexFile = spec.PageIndexFile
	}
	return nil
}

// writeSnapshot has Firecracker write the files (in the jail's root with
// the jailer, then moved out), and syncs them.
func (m *Machine) writeSnapshot(ctx context.Context, kind, stateFile, memFile string) (vmm.SnapshotResult, error) {
	stateIn, memIn := stateFile, memFile
	if m.root != "" {
		stateIn, memIn = "/snapshot.out.state", "/snapshot.out.mem"
	}
	if err := m.api.put(ctx, "/snapshot/create", snapshotCreate{SnapshotType: kind, SnapshotPath: stateIn, MemFilePath: memIn}); err != nil {
		return vmm.SnapshotResult{}, err
	}
	res := vmm.SnapshotResult{StateFile: stateFile, MemoryFile: memFile}
	for _, f := range []struct{ in, out string }{{stateIn, stateFile}, {memIn, memFile}} {
		if m.root != "" {
			if err := os.Rename(m.hostPath(f.in), f.out); err != nil {
				return res, fmt.Errorf("move %s out of the jail: %w", f.in, err)
			}
		}
		n, err := syncFile(f.out)
		if err != nil {
			return res, err
		}
		res.BytesWritten += n
	}
	return res, nil
}

// syncFile fsyncs a file and its directory, and returns the bytes it
// holds on disk (a Diff memory file is sparse).
func syncFile(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("sync %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		dir.Sync()
		dir.Close()
	}
	return allocated(st), nil
}

// createLayer makes a booted machine's empty writable disk.
func (m *Machine) createLayer() error {
	f, err := os.OpenFile(m.hostPath("/"+layerName), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("the writable layer: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(m.d.cfg.LayerMiB) << 20); err != nil {
		return fmt.Errorf("the writable layer: %w", err)
	}
	if m.root != "" {
		return os.Chown(f.Name(), m.d.cfg.UID, m.d.cfg.GID)
	}
	return nil
}

// prepareLayer gives a child its own copy of the snapshot's layer.
func (m *Machine) prepareLayer() error {
	if m.d.cfg.LayerMiB == 0 {
		return nil
	}
	if err := copyFile(m.restore.StateFile+layerSuffix, m.hostPath("/"+layerName)); err != nil {
		return fmt.Errorf("this child's writable layer: %w", err)
	}
	if m.root != "" {
		return os.Chown(m.hostPath("/"+layerName), m.d.cfg.UID, m.d.cfg.GID)
	}
	return nil
}

// copyFile copies src to dst through a staged file (stage, fsync,
// rename). The kernel's copy_file_range does the copy, which file
// systems with reflinks make a clone.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}
