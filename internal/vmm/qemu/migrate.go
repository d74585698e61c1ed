package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// pollInterval is how often migration status is polled besides waiting for
// QEMU's events.
const pollInterval = 5 * time.Millisecond

// Restore loads the state file handed over by Prepare and lets the guest
// run: it sends migrate-incoming and returns once QEMU reports the VM
// running. On failure the machine is killed: a started incoming migration
// cannot be retried.
func (m *Machine) Restore(ctx context.Context) (_ vmm.RestoreTimings, err error) {
	start := time.Now()
	if err := m.transition("restore", stateRestoring, statePrepared); err != nil {
		return vmm.RestoreTimings{}, err
	}
	defer func() {
		if err != nil {
			m.Kill()
		}
	}()
	// Before the kill above: QEMU has the state file until it is loaded.
	defer m.stateFile.release(ctx)
	sub := m.qmp.SubscribeNames("RESUME", "MIGRATION")
	defer sub.Cancel()
	load := time.Now()
	if err := m.stateFile.migrate(ctx, "migrate-incoming"); err != nil {
		return vmm.RestoreTimings{}, m.failure("migrate-incoming", err)
	}
	poll := time.NewTicker(10 * pollInterval)
	defer poll.Stop()
	for running := false; !running; {
		select {
		case ev := <-sub.C():
			switch ev.Name {
			case "RESUME":
				running = true
			case "MIGRATION":
				var d struct{ Status string }
				json.Unmarshal(ev.Data, &d)
				if d.Status == "failed" {
					return vmm.RestoreTimings{}, m.failure("load state", errors.New("incoming migration failed"))
				}
			}
		case <-poll.C:
			// A safety net should an event go missing.
			var st struct{ Status string }
			if err := m.qmp.Execute(ctx, "query-status", nil, &st); err != nil {
				return vmm.RestoreTimings{}, m.failure("query-status", err)
			}
			running = st.Status == "running"
		case <-m.done:
			return vmm.RestoreTimings{}, m.failure("load state", m.exitDetail())
		case <-ctx.Done():
			return vmm.RestoreTimings{}, m.failure("load state", context.Cause(ctx))
		}
	}
	if err := m.transition("restore", stateRunning, stateRestoring); err != nil {
		return vmm.RestoreTimings{}, err
	}
	now := time.Now()
	return vmm.RestoreTimings{Load: now.Sub(load), Total: now.Sub(start)}, nil
}

// migrationInfo is the part of query-migrate's reply the driver reads.
type migrationInfo struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
	Downtime  int64  `json:"downtime"` // ms
}

// Snapshot saves the device state to spec.StateFile while the guest runs
// (no stop first: clones would come up paused). Guest RAM stays in the
// shared memory file, which is reported as the result's MemoryFile; a
// machine booted without a memory file writes RAM into the state file.
// Only full snapshots are supported. StopAfter is required when RAM is
// shared, and then QEMU quits once the state file is durable. A running
// clone is branched instead (diff, full or live; see branch.go).
func (m *Machine) Snapshot(ctx context.Context, spec vmm.SnapshotSpec) (_ vmm.SnapshotResult, err error) {
	start := time.Now()
	if m.isBranchable() {
		// A running clone: see branch.go.
		return m.branch(ctx, spec)
	}
	switch spec.Type {
	case vmm.SnapshotFull, "":
	case vmm.SnapshotDiff:
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: diff snapshots (dirty-page tracking) are not supported by the qemu driver; take a full snapshot: %w", m.cfg.ID, errdefs.ErrNotImplemented)
	default:
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: snapshot type %q: %w", m.cfg.ID, spec.Type, errdefs.ErrInvalidArgument)
	}
	if spec.StateFile == "" {
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: snapshot without a state file: %w", m.cfg.ID, errdefs.ErrInvalidArgument)
	}
	if m.incoming && m.cfg.MemoryFile != "" {
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: snapshot of a clone (private copy-on-write RAM) is not supported by the qemu driver: %w", m.cfg.ID, errdefs.ErrNotImplemented)
	}
	shared := m.cfg.MemoryFile != ""
	if shared && !spec.StopAfter {
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: a template with shared RAM must stop after its snapshot (StopAfter), or it keeps writing its clones' memory: %w", m.cfg.ID, errdefs.ErrInvalidArgument)
	}
	if err := m.transition("snapshot", stateSnapshotting, stateRunning); err != nil {
		return vmm.SnapshotResult{}, err
	}
	defer func() {
		if err != nil {
			os.Remove(spec.StateFile)
			m.transition("snapshot", stateRunning, stateSnapshotting)
		}
	}()

	if err := m.awaitMigrationCleanup(ctx); err != nil {
		return vmm.SnapshotResult{}, err
	}
	h, err := m.handOverFile(ctx, spec.StateFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, stateFD)
	if err != nil {
		return vmm.SnapshotResult{}, m.failure("hand over state file", err)
	}
	defer h.release(ctx) // on failure
	if err := h.migrate(ctx, "migrate"); err != nil {
		return vmm.SnapshotResult{}, m.failure("migrate", err)
	}
	info, err := m.waitMigration(ctx)
	if err != nil {
		return vmm.SnapshotResult{}, err
	}
	h.release(ctx) // before StopAfter quits QEMU
	saved := time.Since(start)
	// QEMU wrote through its own descriptor; make the data and the name
	// durable before anyone relies on them.
	if err := fsutil.SyncFile(spec.StateFile); err != nil {
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: sync state file: %w", m.cfg.ID, err)
	}
	if err := fsutil.SyncDir(filepath.Dir(spec.StateFile)); err != nil {
		return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: sync state file: %w", m.cfg.ID, err)
	}
	res := vmm.SnapshotResult{
		StateFile:  spec.StateFile,
		MemoryFile: m.cfg.MemoryFile,
		Paused:     time.Duration(info.Downtime) * time.Millisecond,
	}
	if spec.StopAfter {
		if err := m.Stop(ctx); err != nil {
			return vmm.SnapshotResult{}, err
		}
		if shared {
			// The memory file is the snapshot's RAM: on a disk (not tmpfs)
			// it must reach it too.
			if err := fsutil.SyncFile(m.cfg.MemoryFile); err != nil {
				return vmm.SnapshotResult{}, fmt.Errorf("qemu %s: sync memory file: %w", m.cfg.ID, err)
			}
		}
	} else {
		// The source ends a migration paused (postmigrate).
		if err := m.qmp.Execute(ctx, "cont", nil, nil); err != nil {
			return vmm.SnapshotResult{}, m.failure("cont", err)
		}
		m.transition("snapshot", stateRunning, stateSnapshotting)
	}
	res.Duration = time.Since(start)
	m.d.log.Debug("snapshot written", "id", m.cfg.ID, "saved", saved, "total", res.Duration, "downtime", res.Paused)
	return res, nil
}

// waitMigration polls query-migrate until the outgoing migration ends.
func (m *Machine) waitMigration(ctx context.Context) (migrationInfo, error) {
	sub := m.qmp.SubscribeNames("MIGRATION")
	defer sub.Cancel()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		var info migrationInfo
		if err := m.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
			return info, m.failure("query-migrate", err)
		}
		if ended, err := m.migrationEnded(info, "migration"); ended {
			return info, err
		}
		select {
		case <-sub.C():
		case <-t.C:
		case <-m.done:
			return info, m.failure("migrate", m.exitDetail())
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			m.qmp.Execute(cctx, "migrate_cancel", nil, nil)
			cancel()
			return info, m.failure("migrate", context.Cause(ctx))
		}
	}
}

// migrationEnded says whether the migration query-migrate described has
// ended (what names it in the error): completed (nil), or failed or
// cancelled (an error with QEMU's reason).
func (m *Machine) migrationEnded(info migrationInfo, what string) (bool, error) {
	switch info.Status {
	case "completed":
		return true, nil
	case "failed", "cancelled":
		desc := info.ErrorDesc
		if desc == "" {
			desc = "no reason given"
		}
		return true, fmt.Errorf("qemu %s: %s %s: %s: %w", m.cfg.ID, what, info.Status, desc, errdefs.ErrInternal)
	}
	return false, nil
}

// awaitMigrationCleanup returns once QEMU has cleaned up after its last
// outgoing migration, so a new one may start. QEMU reports "completed"
// before its cleanup runs (in a bottom half of the main loop), and the
// cleanup unregisters the migration's yank instance last. A `migrate`
// sent in between is refused with "duplicate yank instance", and, worse,
// QEMU 10 has by then already set its state to "setup" and leaves it
// there: every later migrate is refused with "There's a migration
// process in progress" until a migrate_cancel (seen on an adopted
// machine whose orphan background snapshot had just completed). So every
// outgoing migration waits here first, for the yank instance to be gone.
// It costs one query-yank when nothing is pending.
func (m *Machine) awaitMigrationCleanup(ctx context.Context) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	giveUp := time.NewTimer(migrationCleanupTimeout)
	defer giveUp.Stop()
	for {
		var instances []yankInstance
		if err := m.qmp.Execute(ctx, "query-yank", nil, &instances); err != nil {
			return m.failure("query-yank", err)
		}
		if !slices.ContainsFunc(instances, func(i yankInstance) bool { return i.Type == "migration" }) {
			return nil
		}
		select {
		case <-t.C:
		case <-m.done:
			return m.failure("migration cleanup", m.exitDetail())
		case <-ctx.Done():
			return fmt.Errorf("qemu %s: the previous migration is still being cleaned up (%w); try again shortly: %w",
				m.cfg.ID, context.Cause(ctx), errdefs.ErrUnavailable)
		case <-giveUp.C:
			return fmt.Errorf("qemu %s: the previous migration has not been cleaned up after %v; try again shortly: %w",
				m.cfg.ID, migrationCleanupTimeout, errdefs.ErrUnavailable)
		}
	}
}

// migrationCleanupTimeout bounds awaitMigrationCleanup: QEMU's cleanup
// joins the migration thread and closes its file, which takes
// milliseconds; half a minute is a QEMU that will not.
const migrationCleanupTimeout = 30 * time.Second

// yankInstance is one entry of query-yank's answer.
type yankInstance struct {
	Type string `json:"type"`
}
