package qemu

// Live branches: QEMU's background-snapshot, spooled to a file QEMU owns
// and split into a memory file and a state file (see branch.go for the
// three modes).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/qmp"
)

// LiveBranchSupport says whether Snapshot with vmm.SnapshotLive can work
// on this machine: nil, or an errdefs.ErrFailedPrecondition-class error
// saying what is missing (see liveSupport). Only a restored clone
// branches.
func (m *Machine) LiveBranchSupport() error {
	if !m.incoming || m.cfg.MemoryFile == "" {
		return fmt.Errorf("qemu %s: not a clone with a memory file: %w", m.cfg.ID, errdefs.ErrFailedPrecondition)
	}
	return liveSupport(m.PID(), m.cfg.MemoryFile, m.memID)
}

// liveSupport checks what QEMU 7.2's background-snapshot needs: a
// userfaultfd with write-protection on guest RAM. The kernel offers it for
// anonymous, shmem and hugetlb memory only (not for a private mapping of a
// file on a disk file system), and lets a process without CAP_SYS_PTRACE
// create a userfaultfd only with vm.unprivileged_userfaultfd=1 (QEMU 7.2
// neither uses /dev/userfaultfd nor asks for user-mode-only faults), or
// through /dev/userfaultfd: QEMU 8.1+ in its jail gets a node of its own
// uid (jailSpec). id is
// the memory file's identity when the machine started (Machine.memID), by
// which a file removed since is still found.
func liveSupport(pid int, memFile string, id *fileID) error {
	var sfs unix.Statfs_t
	err := unix.Statfs(memFile, &sfs)
	if errors.Is(err, unix.ENOENT) {
		// Removed since the clone mapped it (its snapshot was removed):
		// the file system of the file its RAM maps, through the mapping.
		if maps, merr := fileMappings(pid, memFile, id, 0); merr == nil {
			err = unix.Statfs(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, maps[0].Start, maps[0].End), &sfs)
		}
	}
	if err != nil {
		return fmt.Errorf("memory file: %w", err)
	}
	if !shmemFS(&sfs) {
		return fmt.Errorf("the clone's memory file %s is not on tmpfs or hugetlbfs (file system magic %#x): QEMU's background-snapshot write-protects guest RAM with userfaultfd, which Linux supports for shmem and hugetlb mappings, not for private mappings of files on disk; use a diff branch: %w",
			memFile, sfs.Type, errdefs.ErrFailedPrecondition)
	}
	uid, err := procUID(pid)
	if err != nil {
		return err
	}
	if uid == 0 || ownsUffdDevice(pid, uid) {
		return nil
	}
	v, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	if err == nil && strings.TrimSpace(string(v)) == "1" {
		return nil
	}
	return fmt.Errorf("QEMU runs as uid %d and vm.unprivileged_userfaultfd is not 1: it cannot create the userfaultfd that background-snapshot needs (run QEMU as root, Config.RunAs empty, or set the sysctl); use a diff branch: %w",
		uid, errdefs.ErrFailedPrecondition)
}

// ownsUffdDevice reports whether the jail of process pid holds a
// userfaultfd device node of its uid (jailSpec), seen through its root.
func ownsUffdDevice(pid, uid int) bool {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/root%s", pid, uffdDevice), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && int(st.Uid) == uid
}

// procUID is the effective uid of a process.
func procUID(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(v)
			if len(f) >= 2 {
				return strconv.Atoi(f[1])
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no Uid", pid)
}

// liveGiveUp bounds how long a live branch waits for QEMU to finish a
// background snapshot after its context has ended (see live).
var liveGiveUp = 2 * time.Minute

// liveCleanupTimeout bounds the QMP calls that undo a live branch's setup,
// which run after the caller's context may have ended (see live).
const liveCleanupTimeout = 30 * time.Second

// live takes a live branch with QEMU's background-snapshot.
//
// QEMU 7.2 leaves guest RAM write-protected when a background snapshot
// breaks off (its stream fails, or migrate_cancel): the guest's next write
// blocks in userfaultfd for good, and with it QEMU's main loop. So the
// stream must never fail under QEMU: it goes to a regular file (a spool
// next to the memory file) that QEMU holds open and writes at its own
// pace, not to a socket this process reads. Nothing this process does, not
// even being killed, can then break the snapshot off: a daemon that dies
// mid-branch leaves QEMU to finish writing a spool nobody reads (removed
// with its staging directory at the next start), and the guest runs on.
// When QEMU is done, the spool is split into the memory file and the state
// file and removed. A branch whose caller gives up still waits for QEMU to
// finish (bounded by liveGiveUp) rather than cancel it.
func (b *brancher) live(ctx context.Context) (err error) {
	m := b.m
	st, err := b.runState(ctx)
	if err != nil {
		return err
	}
	if st != "running" {
		// background-snapshot restarts the guest when it has saved the
		// device state, whatever state it was in.
		return fmt.Errorf("qemu %s: live branch of a guest that is %s: %w", m.cfg.ID, st, errdefs.ErrFailedPrecondition)
	}
	memOut, err := b.create(b.spec.MemoryFile, os.O_RDWR|os.O_EXCL)
	if err != nil {
		return err
	}
	defer memOut.Close()
	stateOut, err := b.create(b.spec.StateFile, os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return err
	}
	defer stateOut.Close()
	spoolPath := b.spec.MemoryFile + liveSpoolSuffix
	spool, err := b.create(spoolPath, os.O_RDWR|os.O_EXCL)
	if err != nil {
		return err
	}
	defer func() {
		spool.Close()
		os.Remove(spoolPath) // whatever happened: the spool is never a result
	}()
	// The cleanup is in place before the setup starts: a call that ctx
	// cuts off may have taken effect in QEMU all the same. Its calls must
	// work after ctx has ended.
	migrating := false
	var spoolFile *handover
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), liveCleanupTimeout)
		defer cancel()
		// QEMU may hold the spool descriptor; a running snapshot keeps
		// its own.
		spoolFile.release(cctx)
		cerr := m.qmp.Execute(cctx, "migrate-set-capabilities", backgroundSnapshot(false), nil)
		if cerr != nil && migrating && errors.Is(cerr, context.DeadlineExceeded) {
			m.Kill()
			err = errors.Join(err, fmt.Errorf("qemu %s: QEMU stopped answering after a failed background snapshot (QEMU 7.2 can leave guest RAM write-protected); killed it: %w",
				m.cfg.ID, errdefs.ErrUnavailable))
			return
		}
		if cerr != nil && err == nil {
			err = m.failure("disable background-snapshot", cerr)
		}
		// The guest runs again after any failure too.
		if st, serr := b.runState(cctx); serr == nil && st != "running" {
			if rerr := b.resume(cctx); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	// QEMU gets a write-only descriptor of the spool (the access mode of
	// its use, which a descriptor set must match).
	spoolW, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", spool.Fd()), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("qemu %s: branch: %w", m.cfg.ID, err)
	}
	spoolFile, err = m.handOver(ctx, spoolW, branchFD)
	spoolW.Close()
	if err != nil {
		return m.failure("hand over the stream spool", err)
	}
	// Not in enableBackgroundSnapshot: its QMP errors mean "live branches
	// unsupported", this one's do not.
	if err := m.awaitMigrationCleanup(ctx); err != nil {
		return err
	}
	err = m.enableBackgroundSnapshot(ctx)
	if err == nil {
		err = hook("capabilities") // tests: as though ctx cut the reply off
	}
	if err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) {
			return fmt.Errorf("qemu %s: live branch: %s: %w", m.cfg.ID, qe.Desc, errdefs.ErrFailedPrecondition)
		}
		return m.failure("enable background-snapshot", err)
	}

	pt := &pauseTimes{sub: m.qmp.SubscribeNames("STOP", "RESUME")}
	defer pt.sub.Cancel()
	if err := hook("before-migrate"); err != nil {
		return err
	}
	tStart := time.Now()
	err = spoolFile.migrate(ctx, "migrate")
	if err == nil {
		err = hook("migrate") // tests: as though ctx cut the reply off
	}
	if err != nil {
		if ctx.Err() != nil && b.migrationRunning(ctx) {
			// QEMU started the snapshot all the same. It refuses to switch
			// the capability off until the snapshot has ended, which
			// waitLive waits for (rather than cancel it, see above).
			migrating = true
			b.waitLive(ctx)
		}
		return m.failure("migrate", err)
	}
	migrating = true
	info, err := b.waitLive(ctx)
	tDone := time.Now()
	if err != nil {
		return err
	}
	if err := hook("stream"); err != nil {
		return err
	}
	// The spool is QEMU's writing: splitStream checks it against the
	// machine's memory size.
	r, err := splitStream(bufio.NewReaderSize(io.NewSectionReader(spool, 0, 1<<62), 1<<20), memOut, stateOut, memBlockName, int64(m.cfg.MemoryMiB)<<20)
	if err != nil {
		return fmt.Errorf("qemu %s: live branch: convert the stream: %w", m.cfg.ID, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("qemu %s: live branch: %w", m.cfg.ID, context.Cause(ctx))
	}
	if err := hook("converted"); err != nil {
		return err
	}
	b.pause = pt.collect(100*time.Millisecond, time.Duration(info.Downtime)*time.Millisecond)
	b.written = r.MemBytes + r.StateBytes
	b.pages = r.MemPages
	b.detail = fmt.Sprintf("snapshot %v, stream %d bytes, %d pages with data, %d zero pages, %d other pages, state %d bytes, converted %v after",
		tDone.Sub(tStart).Round(time.Millisecond), r.StreamBytes, r.MemPages, r.ZeroPages, r.OtherPages,
		r.StateBytes, time.Since(tDone).Round(time.Millisecond))
	return nil
}

// enableBackgroundSnapshot switches background-snapshot on; the caller
// has waited for the previous migration (this daemon's, or an orphan an
// adopted machine finished) to be cleaned up (awaitMigrationCleanup).
// QEMU checks then that it can write-protect guest RAM by registering a
// userfaultfd on it; a memory QEMU really cannot write-protect is refused
// before (liveSupport), so "not compatible" here is retried briefly
// (retryCleanup) in case a write-protection is still being released.
func (m *Machine) enableBackgroundSnapshot(ctx context.Context) error {
	return m.retryCleanup(ctx, "not compatible", func() error {
		return m.qmp.Execute(ctx, "migrate-set-capabilities", backgroundSnapshot(true), nil)
	})
}

// retryCleanup runs call until it succeeds, fails with another error than
// a QMP error whose description holds match (what an earlier migration
// still cleaning up causes), or compatRetry has passed.
func (m *Machine) retryCleanup(ctx context.Context, match string, call func() error) error {
	deadline := time.Now().Add(compatRetry)
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		err := call()
		var qe *qmp.Error
		if err == nil || !errors.As(err, &qe) || !strings.Contains(qe.Desc, match) || time.Now().After(deadline) {
			return err
		}
		m.d.log.Debug("refused while an earlier migration may still be cleaning up, trying again", "id", m.cfg.ID, "err", qe.Desc)
		select {
		case <-t.C:
		case <-m.done:
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// compatRetry bounds retryCleanup's retries.
const compatRetry = 5 * time.Second

// backgroundSnapshot is migrate-set-capabilities' argument that switches
// QEMU's background-snapshot on or off.
func backgroundSnapshot(on bool) map[string]any {
	return map[string]any{"capabilities": []map[string]any{{"capability": "background-snapshot", "state": on}}}
}

// liveSpoolSuffix names a live branch's stream spool, next to its memory
// file (so in the snapshot's staging directory).
const liveSpoolSuffix = ".live-stream"

// migrationRunning says whether QEMU runs a migration; it works after ctx
// has ended.
func (b *brancher) migrationRunning(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), liveCleanupTimeout)
	defer cancel()
	var info migrationInfo
	if err := b.m.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
		return false
	}
	ended, _ := b.m.migrationEnded(info, "")
	return info.Status != "" && info.Status != "none" && !ended
}

// waitLive polls query-migrate until the background snapshot ends. When
// ctx ends first it keeps waiting, up to liveGiveUp, without cancelling
// (see live), and then fails with ctx's error.
func (b *brancher) waitLive(ctx context.Context) (migrationInfo, error) {
	m := b.m
	sub := m.qmp.SubscribeNames("MIGRATION")
	defer sub.Cancel()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	qctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var giveUp <-chan time.Time
	done := ctx.Done()
	for {
		var info migrationInfo
		if err := m.qmp.Execute(qctx, "query-migrate", nil, &info); err != nil {
			return info, m.failure("query-migrate", err)
		}
		if ended, err := m.migrationEnded(info, "background snapshot"); ended {
			if err == nil && ctx.Err() != nil {
				err = fmt.Errorf("qemu %s: live branch: %w", m.cfg.ID, context.Cause(ctx))
			}
			return info, err
		}
		select {
		case <-sub.C():
		case <-t.C:
		case <-m.done:
			return info, m.failure("background snapshot", m.exitDetail())
		case <-done:
			// Let it finish: cancelling would freeze the guest.
			done = nil
			timer := time.NewTimer(liveGiveUp)
			defer timer.Stop()
			giveUp = timer.C
		case <-giveUp:
			m.d.log.Warn("background snapshot still running long after the branch was cancelled; cancelling it", "id", m.cfg.ID)
			m.qmp.Execute(qctx, "migrate_cancel", nil, nil)
			return info, fmt.Errorf("qemu %s: live branch: %w", m.cfg.ID, context.Cause(ctx))
		}
	}
}

// settleAdoptedMigration runs before the first branch of an adopted
// machine. A daemon killed during a live branch leaves QEMU writing the
// background snapshot into a spool nobody reads, with the capability
// still on. Cancelling it would freeze the guest (see live), and QEMU
// refuses another migration while it runs, so this waits for it to end
// (it writes at disk speed, within liveGiveUp), then switches the
// capability off: a later diff or full branch must not inherit it.
func (m *Machine) settleAdoptedMigration(ctx context.Context) error {
	sub := m.qmp.SubscribeNames("MIGRATION")
	defer sub.Cancel()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	giveUp := time.NewTimer(liveGiveUp)
	defer giveUp.Stop()
	logged := false
	for {
		var info migrationInfo
		if err := m.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
			return m.failure("query-migrate", err)
		}
		if ended, _ := m.migrationEnded(info, ""); ended || info.Status == "" || info.Status == "none" {
			break
		}
		if !logged {
			m.d.log.Info("waiting for a background snapshot the previous daemon left running", "id", m.cfg.ID, "status", info.Status)
			logged = true
			if err := hook("settle-wait"); err != nil {
				return err
			}
		}
		select {
		case <-sub.C():
		case <-t.C:
		case <-m.done:
			return m.failure("background snapshot", m.exitDetail())
		case <-ctx.Done():
			return fmt.Errorf("qemu %s: branch: a background snapshot the previous daemon started is still being written (%w); try again shortly: %w",
				m.cfg.ID, context.Cause(ctx), errdefs.ErrUnavailable)
		case <-giveUp.C:
			return fmt.Errorf("qemu %s: branch: a background snapshot the previous daemon started has run for over %v: %w",
				m.cfg.ID, liveGiveUp, errdefs.ErrUnavailable)
		}
	}
	if err := m.qmp.Execute(ctx, "migrate-set-capabilities", backgroundSnapshot(false), nil); err != nil {
		return m.failure("disable background-snapshot", err)
	}
	return nil
}
