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
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
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

// paused takes a diff or full branch: the guest is stopped while its
// written pages (or all its RAM) and the device state are saved.
func (b *brancher) paused(ctx context.Context) (err error) {
	m := b.m
	t0 := time.Now()
	st, err := b.runState(ctx)
	if err != nil {
		return err
	}
	wasRunning := st == "running"
	memSize := uint64(m.cfg.MemoryMiB) << 20
	maps, err := fileMappings(b.pid, m.cfg.MemoryFile, m.memID, memSize)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	procMem, err := os.Open(fmt.Sprintf("/proc/%d/mem", b.pid))
	if err != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	defer procMem.Close()
	guest := &guestMem{pid: b.pid, proc: procMem}
	var (
		pagemap *os.File
		base    []byte // the memory file, to compare written pages with
		// memFile, when set, is copied before the stop and the written
		// pages go over the copy: a diff that is not a layer, or a full
		// branch (see the comment at the top).
		memFile *os.File
	)
	switch {
	case b.mode == vmm.SnapshotDiff && !b.spec.Layer:
		if memFile, err = openMemoryFile(b.pid, m.cfg.MemoryFile, maps); err != nil {
			return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
		}
	case b.mode == vmm.SnapshotFull:
		memFile, _ = openMemoryFile(b.pid, m.cfg.MemoryFile, maps) // nil: copy all of RAM
	}
	if memFile != nil {
		defer memFile.Close()
	}
	if b.mode == vmm.SnapshotDiff || memFile != nil {
		if pagemap, err = os.Open(fmt.Sprintf("/proc/%d/pagemap", b.pid)); err != nil {
			return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
		}
		defer pagemap.Close()
	}
	if b.mode == vmm.SnapshotDiff {
		if base, err = mapHugeBase(m.cfg.MemoryFile, memSize); err != nil {
			return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
		}
		if base != nil {
			defer unix.Munmap(base)
		}
	}
	// The small RAM blocks (firmware, ACPI tables) and where they live.
	var info string
	if err := m.qmp.Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info ramblock"}, &info); err != nil {
		return m.failure("info ramblock", err)
	}
	blocks, err := parseRAMBlocks(info)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	romAddr, err := locateBlocks(b.pid, blocks, memBlockName, procMem)
	if err != nil {
		// Grandchildren still run (the firmware is only used at a reset,
		// which -no-reboot turns into an exit), with zeros in those blocks.
		m.d.log.Warn("branch without firmware and ACPI blocks: their mappings were not found", "id", m.cfg.ID, "err", err)
		romAddr = nil
	}

	// The memory file: a sparse copy of the clone's (diff), or empty
	// (full, and a diff layer, which gets only the pages the clone wrote).
	out, err := b.create(b.spec.MemoryFile, os.O_RDWR|os.O_EXCL)
	if err != nil {
		return err
	}
	defer out.Close()
	if memFile != nil {
		n, err := fsutil.CopyCompact(out, memFile, int64(memSize))
		b.written += n
		if err != nil {
			return fmt.Errorf("qemu %s: branch: copy memory file: %w", m.cfg.ID, err)
		}
	} else if err := out.Truncate(int64(memSize)); err != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	tCopy := time.Now()

	// The device state goes to a memfd that QEMU opens as /dev/fdset/N:
	// QEMU needs no access to any directory, whatever user it runs as.
	devFD, err := unix.MemfdCreate("forkd-devstate", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: memfd: %w", m.cfg.ID, err)
	}
	dev := os.NewFile(uintptr(devFD), "devstate")
	defer dev.Close()
	// add-fd matches the access mode of open(): hand over a write-only
	// descriptor of the same memfd.
	devW, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", devFD), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	devSet, err := m.addFdset(ctx, devW, devStateFD)
	devW.Close()
	if err != nil {
		return m.failure("add-fd", err)
	}
	defer devSet.release(ctx)

	if err := hook("before-stop"); err != nil {
		return err
	}
	// The pause.
	pt := &pauseTimes{sub: m.qmp.SubscribeNames("STOP", "RESUME")}
	defer pt.sub.Cancel()
	tStop := time.Now()
	if wasRunning {
		if err := m.qmp.Execute(ctx, "stop", nil, nil); err != nil {
			// It may have stopped all the same.
			if rerr := b.resume(ctx); rerr != nil {
				return errors.Join(m.failure("stop", err), rerr)
			}
			return m.failure("stop", err)
		}
	}
	tStopped := time.Now()
	resumed := !wasRunning
	defer func() {
		if !resumed {
			if rerr := b.resume(ctx); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err := hook("stopped"); err != nil {
		return err
	}
	// QEMU writes the device state while this process copies pages.
	saved := make(chan error, 1)
	go func() {
		saved <- m.qmp.Execute(ctx, "xen-save-devices-state",
			map[string]any{"filename": devSet.path(), "live": false}, nil)
	}()
	var (
		idx     *memlayer.Builder
		mw      = newMemWriter(out, int64(memSize), memFile != nil)
		copyErr error
		scanned string
	)
	if b.mode == vmm.SnapshotDiff || memFile != nil {
		idx = &memlayer.Builder{PageSize: pageSize, MemorySize: memSize}
		scanned, copyErr = copyPrivatePages(maps, pagemap, guest, mw, idx, memSize, base)
	} else {
		copyErr = copyAllPages(maps, guest, mw, memSize)
	}
	if copyErr == nil {
		copyErr = mw.flush()
	}
	roms, romErr := readBlocks(procMem, blocks, romAddr)
	tCopied := time.Now()
	saveErr := <-saved
	tSaved := time.Now()
	if wasRunning {
		resumed = true
		if err := b.resume(ctx); err != nil {
			return err
		}
	}
	tCont := time.Now()
	// The pause as the caller saw it: from sending stop to cont's reply
	// (QEMU's STOP and RESUME events, in the debug detail, give the
	// guest's own, a little shorter).
	b.pause = tCont.Sub(tStop)
	guestPause := pt.collect(100*time.Millisecond, 0)
	if copyErr != nil {
		return fmt.Errorf("qemu %s: branch: copy guest memory: %w", m.cfg.ID, copyErr)
	}
	if romErr != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, romErr)
	}
	if saveErr != nil {
		return m.failure("save device state", saveErr)
	}
	if err := hook("resumed"); err != nil {
		return err
	}
	b.written += mw.bytes
	b.pages = mw.pages
	if b.mode == vmm.SnapshotDiff {
		ix := idx.Index()
		b.pages = int64(ix.Pages())
		if b.spec.PageIndexFile != "" {
			if err := memlayer.WriteFile(b.spec.PageIndexFile, ix); err != nil {
				return fmt.Errorf("qemu %s: branch: page index: %w", m.cfg.ID, err)
			}
			b.created = append(b.created, b.spec.PageIndexFile)
			b.index = b.spec.PageIndexFile
		}
	}

	// The state file: the device state with the RAM sections a template's
	// state file has before it.
	devState, err := readAllAt(dev)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: read device state: %w", m.cfg.ID, err)
	}
	stateOut, err := b.create(b.spec.StateFile, os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return err
	}
	defer stateOut.Close()
	n, err := writeBranchState(stateOut, blocks, roms, devState)
	b.written += n
	if err != nil {
		return fmt.Errorf("qemu %s: branch: state file: %w", m.cfg.ID, err)
	}
	b.detail = fmt.Sprintf("prepare %v, stop %v, copy %v (%s), device state +%v, cont %v, state file %v; guest paused %v (STOP to RESUME)",
		tCopy.Sub(t0).Round(time.Microsecond), tStopped.Sub(tStop).Round(time.Microsecond),
		tCopied.Sub(tStopped).Round(time.Microsecond), scanned, tSaved.Sub(tCopied).Round(time.Microsecond),
		tCont.Sub(tSaved).Round(time.Microsecond), time.Since(tCont).Round(time.Microsecond), guestPause)
	return nil
}

// openMemoryFile opens the file a clone's RAM maps (maps, from
// fileMappings): by its path while that still names it, else through
// /proc/PID/map_files, which reaches it after it was removed (root only).
func openMemoryFile(pid int, path string, maps []mapping) (*os.File, error) {
	same := func(f *os.File) bool {
		var st unix.Stat_t
		return unix.Fstat(int(f.Fd()), &st) == nil && st.Ino == maps[0].Inode &&
			unix.Major(st.Dev) == maps[0].Major && unix.Minor(st.Dev) == maps[0].Minor
	}
	if f, err := os.Open(path); err == nil {
		if same(f) {
			return f, nil
		}
		f.Close()
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, maps[0].Start, maps[0].End))
	if err != nil {
		return nil, fmt.Errorf("memory file %s: gone from its path, and its mapping: %w", path, err)
	}
	if !same(f) {
		f.Close()
		return nil, fmt.Errorf("memory file %s: its mapping in process %d is another file", path, pid)
	}
	return f, nil
}

// mapHugeBase maps a clone's memory file read-only when it is on
// hugetlbfs, and returns nil otherwise. There a write copies a whole huge
// page (2 MiB), most of it unchanged: a diff branch compares the copied
// pages with the file and keeps only the 4 KiB pages that differ, so a
// layer is as small as on tmpfs. The file is allocated whole when it is
// made (package sandbox), so this shared mapping reserves no new pages.
func mapHugeBase(path string, size uint64) ([]byte, error) {
	huge, err := fsutil.HugePageSize(filepath.Dir(path))
	if err != nil || huge == 0 {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
}

// copyPrivatePages copies the pages the clone wrote (anonymous pages in
// its private mappings of the memory file) into mw at their file offsets
// and records them in idx. With base (the memory file's contents), pages
// equal to it are left out. It says how it found them.
func copyPrivatePages(maps []mapping, pagemap *os.File, guest *guestMem, mw *memWriter, idx *memlayer.Builder, memSize uint64, base []byte) (string, error) {
	buf := make([]byte, 1<<20)
	how := "PAGEMAP_SCAN"
	if base != nil {
		how = "compared with the file"
	}
	for _, mp := range maps {
		end := mp.End
		if mp.Offset >= memSize {
			continue
		}
		if mp.Offset+mp.size() > memSize {
			end = mp.Start + (memSize - mp.Offset)
		}
		runs, scan, err := privatePages(pagemap, mp.Start, end, forcePagemapRead)
		if err != nil {
			return how, err
		}
		if !scan {
			how = "pagemap"
		}
		for _, r := range runs {
			off := mp.Offset + (r.Off - mp.Start)
			if base != nil {
				if err := copyChangedMem(guest, r.Off, r.Len, off, mw, idx, buf, base); err != nil {
					return how, err
				}
				continue
			}
			idx.Add(off/pageSize, r.Len/pageSize)
			if err := copyMem(guest, r.Off, r.Len, off, mw, buf); err != nil {
				return how, err
			}
		}
	}
	return how, nil
}

// forcePagemapRead makes diff branches read pagemap entries instead of
// using PAGEMAP_SCAN (tests of the fallback).
var forcePagemapRead bool

// copyAllPages copies all of the clone's RAM into mw.
func copyAllPages(maps []mapping, guest *guestMem, mw *memWriter, memSize uint64) error {
	buf := make([]byte, 2<<20)
	for _, mp := range maps {
		if mp.Offset >= memSize {
			continue
		}
		n := min(mp.size(), memSize-mp.Offset)
		if err := copyMem(guest, mp.Start, n, mp.Offset, mw, buf); err != nil {
			return err
		}
	}
	return nil
}

// guestMem reads a stopped QEMU's memory: with process_vm_readv, which
// copies straight from the pages (about 2.5x faster here than reading
// /proc/PID/mem, which bounces every page through a kernel buffer), and
// /proc/PID/mem where that syscall is not allowed (seccomp, ENOSYS).
type guestMem struct {
	pid     int
	proc    *os.File
	noVMRdv bool
}

// read fills buf with the memory at addr.
func (g *guestMem) read(buf []byte, addr uint64) error {
	for !g.noVMRdv && len(buf) > 0 {
		local := []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}}
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}
		n, err := unix.ProcessVMReadv(g.pid, local, remote, 0)
		if err != nil {
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
				g.noVMRdv = true
				break
			}
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		buf, addr = buf[n:], addr+uint64(n)
	}
	if len(buf) == 0 {
		return nil
	}
	_, err := g.proc.ReadAt(buf, int64(addr))
	return err
}

// copyMem copies n bytes of process memory at addr into mw at off.
func copyMem(guest *guestMem, addr, n, off uint64, mw *memWriter, buf []byte) error {
	for done := uint64(0); done < n; {
		k := min(uint64(len(buf)), n-done)
		if err := guest.read(buf[:k], addr+done); err != nil {
			return fmt.Errorf("read guest memory at %#x: %w", addr+done, err)
		}
		if err := mw.put(int64(off+done), buf[:k]); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// copyChangedMem is copyMem for pages that may equal the memory file's
// (base): only the runs of pages that differ from it are copied into mw
// and recorded in idx.
func copyChangedMem(guest *guestMem, addr, n, off uint64, mw *memWriter, idx *memlayer.Builder, buf, base []byte) error {
	for done := uint64(0); done < n; {
		k := min(uint64(len(buf)), n-done)
		if err := guest.read(buf[:k], addr+done); err != nil {
			return fmt.Errorf("read guest memory at %#x: %w", addr+done, err)
		}
		at := off + done
		if at+k > uint64(len(base)) {
			return fmt.Errorf("guest pages %#x+%#x outside the %d-byte memory file", at, k, len(base))
		}
		for i := uint64(0); i < k; {
			same := bytes.Equal(buf[i:i+pageSize], base[at+i:at+i+pageSize])
			j := i + pageSize
			for j < k && bytes.Equal(buf[j:j+pageSize], base[at+j:at+j+pageSize]) == same {
				j += pageSize
			}
			if !same {
				idx.Add((at+i)/pageSize, (j-i)/pageSize)
				if err := mw.put(int64(at+i), buf[i:j]); err != nil {
					return err
				}
			}
			i = j
		}
		done += k
	}
	return nil
}

// readBlocks reads the used part of the located RAM blocks.
func readBlocks(procMem *os.File, blocks []hmpRAMBlock, addr map[string]uint64) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, b := range blocks {
		a, ok := addr[b.Name]
		if !ok {
			continue
		}
		if b.Used > maxOtherRAMBytes {
			// QEMU's own word (info ramblock): not to be trusted with an allocation.
			return nil, fmt.Errorf("RAM block %s of %d bytes: more than %d", b.Name, b.Used, maxOtherRAMBytes)
		}
		data := make([]byte, (b.Used+pageSize-1)&^(pageSize-1))
		if _, err := procMem.ReadAt(data, int64(a)); err != nil {
			return nil, fmt.Errorf("read RAM block %s: %w", b.Name, err)
		}
		out[b.Name] = data
	}
	return out, nil
}

// readAllAt reads a file from its start: the device state QEMU saved,
// at most maxDeviceStateBytes.
func readAllAt(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxDeviceStateBytes {
		return nil, streamErr("device state of %d bytes, more than %d", st.Size(), maxDeviceStateBytes)
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, err
	}
	return data, nil
}

// branchConfig is the configuration section of a branch's state file:
// the machine type and the migration capabilities QEMU validates that
// the driver enables (x-ignore-shared, set on every machine by start).
func branchConfig() streamConfig {
	return streamConfig{Machine: branchMachineType, Caps: []string{capIgnoreShared}}
}

// branchBlockList is the block list of the "ram" start section: every RAM
// block with its used length, and its guest address (which QEMU checks
// only for blocks it skips as shared: none in a clone).
func branchBlockList(blocks []hmpRAMBlock) []ramBlockInfo {
	list := make([]ramBlockInfo, 0, len(blocks))
	for _, b := range blocks {
		e := ramBlockInfo{Name: b.Name, Length: b.Used}
		if b.Name == biosBlock {
			e.Addr = 1<<32 - b.Total
		}
		list = append(list, e)
	}
	return list
}

// writeBranchPrefix writes what precedes the device state in a branch's
// state file: header, configuration, and the ram sections with the block
// list and the pages of the small blocks in roms.
func writeBranchPrefix(sw *streamWriter, ramID uint32, blocks []hmpRAMBlock, roms map[string][]byte) {
	sw.header()
	sw.config(branchConfig())
	sw.sectionHeader(sectionHeader{Type: secStart, ID: ramID, Name: ramSectionName, Version: ramSectionVersion})
	sw.blockList(branchBlockList(blocks), true)
	sw.eos()
	sw.footer(ramID)
	if len(roms) > 0 {
		sw.sectionHeader(sectionHeader{Type: secPart, ID: ramID})
		for _, b := range blocks {
			data, ok := roms[b.Name]
			if !ok || b.Name == memBlockName {
				continue
			}
			for off := 0; off < len(data); off += pageSize {
				sw.page(b.Name, uint64(off), data[off:off+pageSize])
			}
		}
		sw.eos()
		sw.footer(ramID)
	}
	sw.sectionHeader(sectionHeader{Type: secEnd, ID: ramID})
	sw.eos()
	sw.footer(ramID)
}

// vmDescription ends a state file like QEMU's own: loaders read and
// ignore it, but complain when it is missing.
var vmDescription = []byte(`{"page_size":4096,"devices":[]}`)

// writeBranchState writes a branch's state file from the device state
// QEMU saved (xen-save-devices-state: a stream of device sections only)
// and returns its size.
func writeBranchState(f *os.File, blocks []hmpRAMBlock, roms map[string][]byte, devState []byte) (int64, error) {
	if len(devState) < 9 || string(devState[:4]) != "QEVM" || devState[7] != streamVersion {
		return 0, streamErr("device state without a QEVM version 3 header")
	}
	body := devState[8:]
	if body[0] != secFull || body[len(body)-1] != secEOF {
		return 0, streamErr("device state does not start with a device section and end with EOF")
	}
	sw := newStreamWriter(f)
	writeBranchPrefix(sw, ramSectionID, blocks, roms)
	sw.write(body)
	sw.u8(secVMDescription)
	sw.be32(uint32(len(vmDescription)))
	sw.write(vmDescription)
	return sw.n, sw.flush()
}
