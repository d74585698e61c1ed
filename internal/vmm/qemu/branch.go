package qemu

// Branching a running clone: Snapshot of a machine restored from a
// template writes a new template (a memory file and a state file) that
// grandchildren restore exactly like the original one, and lets the clone
// run on.
//
// A clone's RAM is its memory file mapped copy-on-write, so the clone's
// memory is the file plus the pages it has written. Three ways to capture
// it (vmm.SnapshotType):
//
//   - diff (the default): before pausing, copy the memory file's data
//     extents into a sparse copy (a reflink where the file system has
//     them); then stop the guest, find the pages it wrote (anonymous pages
//     of its private mapping: PAGEMAP_SCAN, or /proc/PID/pagemap) and copy
//     them from /proc/PID/mem over the copy, while QEMU saves the device
//     state without RAM (xen-save-devices-state); then cont. The pause
//     grows with the pages the clone wrote, not with its memory size.
//   - full: a self-contained memory file. While the guest runs, copy the
//     clone's memory file (immutable: no one writes it, the clone's writes
//     go to private pages); then stop it and copy the pages it wrote over
//     that copy, as a diff does. The pause is a diff's, whatever the
//     memory size. Only if the memory file cannot be opened (its path is
//     gone and /proc/PID/map_files is refused) is all RAM copied while
//     stopped, zero pages left as holes; that pause grows with the memory.
//   - live: QEMU's background-snapshot (userfaultfd write-protection
//     inside QEMU; the guest runs on while its RAM is saved as of the
//     branch instant), streamed through a socket into a converter that
//     splits the migration stream into a sparse memory file and a small
//     state file. The guest pauses only while QEMU saves the device state
//     and write-protects RAM. It needs the memory file on tmpfs or
//     hugetlbfs and a QEMU allowed to create a userfaultfd (root, or
//     vm.unprivileged_userfaultfd=1); see liveSupport.
//
// In every mode the state file is a complete QEMU 7.2 migration stream
// without the pages of guest memory (RAM block "mem"): the header, the
// configuration section, the "ram" sections with the block list and the
// pages of the small RAM blocks (firmware and ACPI tables; QEMU does not
// restore them under -incoming, so they must be in the stream, or a
// grandchild would have zeros at its reset vector), and the device
// state. A grandchild is prepared like any clone: PrepareSpec with
// MemoryFile = the branch's memory file (mapped share=off) and StateFile =
// the branch's state file; it loads it with x-ignore-shared through
// migrate-incoming and runs without a cont.
//
// SnapshotSpec.MemoryFile must not exist (it could be another snapshot's
// memory, mapped by clones); StateFile is created or truncated; a diff
// branch also writes PageIndexFile when it is set (package memlayer). A
// failed branch removes what it created. SnapshotSpec.Type "" means diff.
//
// The source clone resumes whatever fails: every path that stopped the
// guest sends cont (with a context of its own) before it returns.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/qmp"
	"github.com/forkd-dev/forkd/internal/vmm"
)

const (
	// branchMachineType is the machine type the configuration section of
	// a branch's state file names: the driver's -M (args.go).
	branchMachineType = "microvm"

	// ramSectionID is the section id of the "ram" handler in the state
	// files of diff and full branches. QEMU numbers its handlers in
	// registration order (the ram handler is 2 on QEMU 7.2 x86, 1 on
	// 10.0); a loader only needs it unique among the sections before the
	// device state, which any non-zero id is.
	ramSectionID = 2

	// biosBlock is the firmware RAM block, mapped just below 4 GiB.
	biosBlock = "pc.bios"

	// resumeTimeout bounds the cont that ends a pause when the caller's
	// context has already ended.
	resumeTimeout = 10 * time.Second
)

// branchHook, when set (tests), runs at named points of a branch; an
// error it returns fails the branch there.
var branchHook func(point string) error

func hook(point string) error {
	if branchHook != nil {
		return branchHook(point)
	}
	return nil
}

// isBranchable reports whether Snapshot should branch: a clone (RAM mapped
// privately from a memory file) that has been restored.
func (m *Machine) isBranchable() bool {
	if !m.incoming || m.cfg.MemoryFile == "" {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state == stateRunning || m.state == stateSnapshotting
}

// branch is Snapshot of a running clone (see the comment at the top).
func (m *Machine) branch(ctx context.Context, spec vmm.SnapshotSpec) (res vmm.SnapshotResult, err error) {
	start := time.Now()
	mode := spec.Type
	if mode == "" {
		mode = vmm.SnapshotDiff
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("qemu %s: branch: %s: %w", m.cfg.ID, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	switch mode {
	case vmm.SnapshotDiff, vmm.SnapshotFull, vmm.SnapshotLive:
	default:
		return res, bad("snapshot type %q (diff, full or live)", spec.Type)
	}
	if spec.StateFile == "" || spec.MemoryFile == "" {
		return res, bad("a branch needs a state file and a memory file")
	}
	if spec.Layer && (mode != vmm.SnapshotDiff || spec.PageIndexFile == "") {
		return res, bad("a layer is a diff branch with a page index file")
	}
	outs := []string{spec.StateFile, spec.MemoryFile}
	if spec.PageIndexFile != "" && mode == vmm.SnapshotDiff {
		outs = append(outs, spec.PageIndexFile)
	}
	for i, p := range outs {
		if sameFile(p, m.cfg.MemoryFile) {
			return res, bad("%s is the clone's own memory file", p)
		}
		for _, q := range outs[:i] {
			if filepath.Clean(p) == filepath.Clean(q) {
				return res, bad("%s named twice", p)
			}
		}
	}
	if mode == vmm.SnapshotLive {
		if err := liveSupport(m.PID(), m.cfg.MemoryFile, m.memID); err != nil {
			return res, fmt.Errorf("qemu %s: live branch: %w", m.cfg.ID, err)
		}
	}
	if err := m.transition("snapshot", stateSnapshotting, stateRunning); err != nil {
		return res, err
	}
	defer m.transition("snapshot", stateRunning, stateSnapshotting)
	if m.adopted.Load() {
		if err := m.settleAdoptedMigration(ctx); err != nil {
			return res, err
		}
		m.adopted.Store(false)
	}
	b := &brancher{m: m, spec: spec, mode: mode, pid: m.PID()}
	defer func() {
		if err != nil {
			for _, p := range b.created {
				os.Remove(p)
			}
		}
	}()
	if mode == vmm.SnapshotLive {
		err = b.live(ctx)
	} else {
		err = b.paused(ctx)
	}
	if err != nil {
		return res, err
	}
	for _, p := range outs[:2] {
		if err := fsutil.SyncFile(p); err != nil {
			return res, fmt.Errorf("qemu %s: branch: sync %s: %w", m.cfg.ID, p, err)
		}
	}
	dirs := map[string]bool{}
	for _, p := range outs {
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		if err := fsutil.SyncDir(d); err != nil {
			return res, fmt.Errorf("qemu %s: branch: sync %s: %w", m.cfg.ID, d, err)
		}
	}
	res = vmm.SnapshotResult{
		StateFile:     spec.StateFile,
		MemoryFile:    spec.MemoryFile,
		Paused:        b.pause,
		BytesWritten:  b.written,
		DirtyPages:    b.pages,
		PageIndexFile: b.index,
	}
	if spec.StopAfter {
		if err := m.Stop(ctx); err != nil {
			return res, err
		}
	}
	res.Duration = time.Since(start)
	m.d.log.Debug("branch written", "id", m.cfg.ID, "mode", mode, "paused", res.Paused, "total", res.Duration,
		"bytes", res.BytesWritten, "pages", res.DirtyPages, "detail", b.detail)
	return res, nil
}

// sameFile reports whether two paths name the same existing file.
func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// brancher is one branch in progress.
type brancher struct {
	m    *Machine
	spec vmm.SnapshotSpec
	mode vmm.SnapshotType
	pid  int

	pause   time.Duration
	written int64
	pages   int64
	index   string
	detail  string   // timings for the debug log
	created []string // files to remove should the branch fail
}

// create opens an output file, creating it, and remembers it.
func (b *brancher) create(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, flag|os.O_CREATE, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("qemu %s: branch: %w", b.m.cfg.ID, err)
	}
	b.created = append(b.created, path)
	return f, nil
}

// runState is the guest's run state (query-status).
func (b *brancher) runState(ctx context.Context) (string, error) {
	var st struct{ Status string }
	if err := b.m.qmp.Execute(ctx, "query-status", nil, &st); err != nil {
		return "", b.m.failure("query-status", err)
	}
	return st.Status, nil
}

// resume lets a guest that was running run again; it works after ctx has
// ended.
func (b *brancher) resume(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
	defer cancel()
	err := b.m.qmp.Execute(ctx, "cont", nil, nil)
	if err == nil {
		return nil
	}
	if st, serr := b.runState(ctx); serr == nil && st == "running" {
		return nil
	}
	return b.m.failure("cont", err)
}

// pauseTimes measures a pause from QEMU's STOP and RESUME events
// (microsecond timestamps), falling back to wall time.
type pauseTimes struct {
	sub        *qmp.Subscription
	stop, cont time.Time // QEMU's timestamps
}

func (p *pauseTimes) collect(wait time.Duration, wall time.Duration) time.Duration {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for p.stop.IsZero() || p.cont.IsZero() {
		select {
		case ev, ok := <-p.sub.C():
			if !ok {
				return wall
			}
			switch {
			case ev.Name == "STOP" && p.stop.IsZero():
				p.stop = ev.Time
			case ev.Name == "RESUME" && !p.stop.IsZero() && p.cont.IsZero():
				p.cont = ev.Time
			}
		case <-timer.C:
			return wall
		}
	}
	if d := p.cont.Sub(p.stop); d >= 0 {
		return d
	}
	return wall
}
