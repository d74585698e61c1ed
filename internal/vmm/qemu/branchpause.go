package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// paused takes a diff or full branch: the guest is stopped while its
// written pages (or all its RAM) and the device state are saved. Its
// steps: open what the copy reads, start the memory file, give QEMU a
// file for the device state, the pause itself, then the page index and
// the state file once the guest runs again.
func (b *brancher) paused(ctx context.Context) error {
	t0 := time.Now()
	in, err := b.openInputs(ctx)
	if err != nil {
		return err
	}
	defer in.close()
	out, err := b.startMemoryFile(in)
	if err != nil {
		return err
	}
	defer out.Close()
	tCopy := time.Now()
	dev, devSet, err := b.deviceStateFile(ctx)
	if err != nil {
		return err
	}
	defer dev.Close()
	defer devSet.release(ctx)
	if err := hook("before-stop"); err != nil {
		return err
	}
	p, err := b.stopAndCopy(ctx, in, out, devSet)
	if err != nil {
		return err
	}
	if err := hook("resumed"); err != nil {
		return err
	}
	if err := b.writeIndex(p.idx); err != nil {
		return err
	}
	if err := b.writeStateFile(in.blocks, p.roms, dev); err != nil {
		return err
	}
	b.detail = fmt.Sprintf("prepare %v, stop %v, copy %v (%s), device state +%v, cont %v, state file %v; guest paused %v (STOP to RESUME)",
		tCopy.Sub(t0).Round(time.Microsecond), p.stopped.Sub(p.stop).Round(time.Microsecond),
		p.copied.Sub(p.stopped).Round(time.Microsecond), p.scanned, p.saved.Sub(p.copied).Round(time.Microsecond),
		p.cont.Sub(p.saved).Round(time.Microsecond), time.Since(p.cont).Round(time.Microsecond), p.guestPause)
	return nil
}

// branchInputs is what a diff or full branch reads: the clone's mappings
// of its memory file and its memory, and the small RAM blocks.
type branchInputs struct {
	wasRunning bool
	memSize    uint64
	maps       []mapping
	procMem    *os.File
	guest      *guestMem
	// pagemap finds the pages the clone wrote (diff, or a full branch
	// over a copy of the memory file).
	pagemap *os.File
	// base is the memory file mapped, to compare written pages with
	// (a diff of a clone on hugetlbfs).
	base []byte
	// memFile, when set, is copied before the stop and the written pages
	// go over the copy: a diff that is not a layer, or a full branch (see
	// the comment at the top).
	memFile *os.File
	blocks  []hmpRAMBlock
	romAddr map[string]uint64
}

func (in *branchInputs) close() {
	for _, f := range []*os.File{in.memFile, in.pagemap, in.procMem} {
		if f != nil {
			f.Close()
		}
	}
	if in.base != nil {
		unix.Munmap(in.base)
	}
}

// openInputs opens what the branch reads, before the pause.
func (b *brancher) openInputs(ctx context.Context) (_ *branchInputs, err error) {
	m := b.m
	fail := func(err error) error { return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err) }
	st, err := b.runState(ctx)
	if err != nil {
		return nil, err
	}
	in := &branchInputs{wasRunning: st == "running", memSize: uint64(m.cfg.MemoryMiB) << 20}
	defer func() {
		if err != nil {
			in.close()
		}
	}()
	if in.maps, err = fileMappings(b.pid, m.cfg.MemoryFile, m.memID, in.memSize); err != nil {
		return nil, fail(err)
	}
	if in.procMem, err = os.Open(fmt.Sprintf("/proc/%d/mem", b.pid)); err != nil {
		return nil, fail(err)
	}
	in.guest = &guestMem{pid: b.pid, proc: in.procMem}
	switch {
	case b.mode == vmm.SnapshotDiff && !b.spec.Layer:
		if in.memFile, err = openMemoryFile(b.pid, m.cfg.MemoryFile, in.maps); err != nil {
			return nil, fail(err)
		}
	case b.mode == vmm.SnapshotFull:
		in.memFile, _ = openMemoryFile(b.pid, m.cfg.MemoryFile, in.maps) // nil: copy all of RAM
	}
	if b.mode == vmm.SnapshotDiff || in.memFile != nil {
		if in.pagemap, err = os.Open(fmt.Sprintf("/proc/%d/pagemap", b.pid)); err != nil {
			return nil, fail(err)
		}
	}
	if b.mode == vmm.SnapshotDiff {
		if in.base, err = mapHugeBase(m.cfg.MemoryFile, in.memSize); err != nil {
			return nil, fail(err)
		}
	}
	// The small RAM blocks (firmware, ACPI tables) and where they live.
	var info string
	if err := m.qmp.Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info ramblock"}, &info); err != nil {
		return nil, m.failure("info ramblock", err)
	}
	if in.blocks, err = parseRAMBlocks(info); err != nil {
		return nil, fail(err)
	}
	in.romAddr, err = locateBlocks(b.pid, in.blocks, memBlockName, in.procMem)
	if err != nil {
		// Grandchildren still run (the firmware is only used at a reset,
		// which -no-reboot turns into an exit), with zeros in those blocks.
		m.d.log.Warn("branch without firmware and ACPI blocks: their mappings were not found", "id", m.cfg.ID, "err", err)
		in.romAddr, err = nil, nil
	}
	return in, nil
}

// startMemoryFile creates the branch's memory file: a sparse copy of the
// clone's (diff), or empty (full, and a diff layer, which gets only the
// pages the clone wrote).
func (b *brancher) startMemoryFile(in *branchInputs) (*os.File, error) {
	out, err := b.create(b.spec.MemoryFile, os.O_RDWR|os.O_EXCL)
	if err != nil {
		return nil, err
	}
	if in.memFile != nil {
		n, err := fsutil.CopyCompact(out, in.memFile, int64(in.memSize))
		b.written += n
		if err != nil {
			out.Close()
			return nil, fmt.Errorf("qemu %s: branch: copy memory file: %w", b.m.cfg.ID, err)
		}
	} else if err := out.Truncate(int64(in.memSize)); err != nil {
		out.Close()
		return nil, fmt.Errorf("qemu %s: branch: %w", b.m.cfg.ID, err)
	}
	return out, nil
}

// deviceStateFile is a memfd that QEMU opens as /dev/fdset/N for the
// device state: QEMU needs no access to any directory, whatever user it
// runs as.
func (b *brancher) deviceStateFile(ctx context.Context) (*os.File, *handover, error) {
	m := b.m
	devFD, err := unix.MemfdCreate("forkd-devstate", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("qemu %s: branch: memfd: %w", m.cfg.ID, err)
	}
	dev := os.NewFile(uintptr(devFD), "devstate")
	// add-fd matches the access mode of open(): hand over a write-only
	// descriptor of the same memfd.
	devW, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", devFD), os.O_WRONLY, 0)
	if err != nil {
		dev.Close()
		return nil, nil, fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	devSet, err := m.addFdset(ctx, devW, devStateFD)
	devW.Close()
	if err != nil {
		dev.Close()
		return nil, nil, m.failure("add-fd", err)
	}
	return dev, devSet, nil
}

// pauseResult is what the pause copied, and when each part ended.
type pauseResult struct {
	idx     *memlayer.Builder // the pages copied (diff, or over a copy)
	roms    map[string][]byte
	scanned string
	// Wall times: stop sent, stopped, pages copied, device state saved,
	// cont answered; guestPause is QEMU's own STOP to RESUME.
	stop, stopped, copied, saved, cont time.Time
	guestPause                         time.Duration
}

// stopAndCopy stops the guest (if it ran), copies the pages it wrote (or all
// of its RAM) while QEMU saves the device state into devSet, and lets it
// run again: every path that stopped it sends cont before returning.
func (b *brancher) stopAndCopy(ctx context.Context, in *branchInputs, out *os.File, devSet *handover) (p pauseResult, err error) {
	m := b.m
	pt := &pauseTimes{sub: m.qmp.SubscribeNames("STOP", "RESUME")}
	defer pt.sub.Cancel()
	p.stop = time.Now()
	if in.wasRunning {
		if err := m.qmp.Execute(ctx, "stop", nil, nil); err != nil {
			// It may have stopped all the same.
			if rerr := b.resume(ctx); rerr != nil {
				return p, errors.Join(m.failure("stop", err), rerr)
			}
			return p, m.failure("stop", err)
		}
	}
	p.stopped = time.Now()
	resumed := !in.wasRunning
	defer func() {
		if !resumed {
			if rerr := b.resume(ctx); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err := hook("stopped"); err != nil {
		return p, err
	}
	// QEMU writes the device state while this process copies pages.
	saved := make(chan error, 1)
	go func() {
		saved <- m.qmp.Execute(ctx, "xen-save-devices-state",
			map[string]any{"filename": devSet.path(), "live": false}, nil)
	}()
	mw := newMemWriter(out, int64(in.memSize), in.memFile != nil)
	var copyErr error
	if b.mode == vmm.SnapshotDiff || in.memFile != nil {
		p.idx = &memlayer.Builder{PageSize: pageSize, MemorySize: in.memSize}
		p.scanned, copyErr = copyPrivatePages(in.maps, in.pagemap, in.guest, mw, p.idx, in.memSize, in.base)
	} else {
		copyErr = copyAllPages(in.maps, in.guest, mw, in.memSize)
	}
	if copyErr == nil {
		copyErr = mw.flush()
	}
	var romErr error
	p.roms, romErr = readBlocks(in.procMem, in.blocks, in.romAddr)
	p.copied = time.Now()
	saveErr := <-saved
	p.saved = time.Now()
	if in.wasRunning {
		resumed = true
		if err := b.resume(ctx); err != nil {
			return p, err
		}
	}
	p.cont = time.Now()
	// The pause as the caller saw it: from sending stop to cont's reply
	// (QEMU's STOP and RESUME events, in the debug detail, give the
	// guest's own, a little shorter).
	b.pause = p.cont.Sub(p.stop)
	p.guestPause = pt.collect(100*time.Millisecond, 0)
	if copyErr != nil {
		return p, fmt.Errorf("qemu %s: branch: copy guest memory: %w", m.cfg.ID, copyErr)
	}
	if romErr != nil {
		return p, fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, romErr)
	}
	if saveErr != nil {
		return p, m.failure("save device state", saveErr)
	}
	b.written += mw.bytes
	b.pages = mw.pages
	return p, nil
}

// writeIndex writes a diff's page index (when asked for) and counts its
// pages.
func (b *brancher) writeIndex(idx *memlayer.Builder) error {
	if b.mode != vmm.SnapshotDiff {
		return nil
	}
	ix := idx.Index()
	b.pages = int64(ix.Pages())
	if b.spec.PageIndexFile == "" {
		return nil
	}
	if err := memlayer.WriteFile(b.spec.PageIndexFile, ix); err != nil {
		return fmt.Errorf("qemu %s: branch: page index: %w", b.m.cfg.ID, err)
	}
	b.created = append(b.created, b.spec.PageIndexFile)
	b.index = b.spec.PageIndexFile
	return nil
}

// writeStateFile writes the state file: the device state with the RAM
// sections a template's state file has before it.
func (b *brancher) writeStateFile(blocks []hmpRAMBlock, roms map[string][]byte, dev *os.File) error {
	devState, err := readAllAt(dev)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: read device state: %w", b.m.cfg.ID, err)
	}
	stateOut, err := b.create(b.spec.StateFile, os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return err
	}
	defer stateOut.Close()
	n, err := writeBranchState(stateOut, blocks, roms, devState)
	b.written += n
	if err != nil {
		return fmt.Errorf("qemu %s: branch: state file: %w", b.m.cfg.ID, err)
	}
	return nil
}
