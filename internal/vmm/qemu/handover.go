package qemu

// Hand-over of migration files: QEMU never opens a path of forkd's. Each
// file it reads or writes for a migration (a clone's state file, a
// template's state file, a live branch's spool, a branch's device state)
// is opened here and passed over QMP as a descriptor (SCM_RIGHTS).
//
// QEMU 9.1 deprecated the "fd:NAME" migration URI for descriptors of
// regular files ("fd: migration to a file is deprecated. Use file:
// instead." in qemu.log; sockets and pipes are still fine). From 9.1 on
// (features.fileMigration) the descriptor goes into a descriptor set
// instead (add-fd), and the migration names it "file:/dev/fdset/N": QEMU
// dups the set's descriptor whose access mode matches its open() (O_RDONLY
// to load, O_WRONLY to save, which also truncates it as open(O_TRUNC)
// would) and reads or writes the same stream format as through fd:.
// mapped-ram, which file: could also do (RAM at fixed file offsets), stays
// off: the state files are streams that the branch code parses
// (streamsplit.go) and clones load as such.
//
// QEMU keeps the set's descriptor until remove-fd, for its lifetime
// otherwise (a clone would hold its template's state file open, a source
// each branch's spool), so every hand-over is released once the migration
// has ended, and on failure. (9.1 also made remove-fd close it at once;
// before, QEMU deferred that while the guest was not running.) A named descriptor (getfd) is QEMU's once a
// migration takes it; one no migration took is closed (closefd). A daemon
// that dies mid-hand-over leaves a set behind, which Adopt removes
// (dropStrayHandovers).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/forkd-dev/forkd/internal/qmp"
)

// Labels of the hand-overs: getfd names (fd:), or add-fd's opaque string.
const (
	// stateFD is a clone's or a template's state file.
	stateFD = "forkd-state"
	// branchFD is a live branch's stream spool.
	branchFD = "forkd-branch"
	// devStateFD is a diff or full branch's device state (a memfd).
	devStateFD = "forkd-devstate"
)

// releaseTimeout bounds release, which runs after the caller's context may
// have ended.
const releaseTimeout = 10 * time.Second

// handover is a file handed to QEMU: a descriptor set (fdset >= 0) or a
// descriptor named by getfd.
type handover struct {
	m     *Machine
	label string
	fdset int64 // -1: a named descriptor
	// taken: a migration command took the named descriptor over (QEMU
	// closes it when the migration ends).
	taken    bool
	released bool
}

// handOverFile opens path with flag and hands it to QEMU for a migration
// (handOver).
func (m *Machine) handOverFile(ctx context.Context, path string, flag int, label string) (*handover, error) {
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return m.handOver(ctx, f, label)
}

// handOver hands f to QEMU for a migration (migrate): as a descriptor set
// where QEMU has fileMigration, else by getfd as label. QEMU gets a
// duplicate; the caller keeps f.
func (m *Machine) handOver(ctx context.Context, f *os.File, label string) (*handover, error) {
	if m.feat.fileMigration {
		return m.addFdset(ctx, f, label)
	}
	if err := m.qmp.ExecuteWithFiles(ctx, "getfd", map[string]string{"fdname": label}, nil, f); err != nil {
		return nil, err
	}
	return &handover{m: m, label: label, fdset: -1}, nil
}

// addFdset hands f to QEMU as a descriptor set, which QEMU opens as
// path(), whatever its version.
func (m *Machine) addFdset(ctx context.Context, f *os.File, label string) (*handover, error) {
	var info struct {
		ID int64 `json:"fdset-id"`
	}
	if err := m.qmp.ExecuteWithFiles(ctx, "add-fd", map[string]string{"opaque": label}, &info, f); err != nil {
		return nil, err
	}
	return &handover{m: m, label: label, fdset: info.ID}, nil
}

// path is the name QEMU opens a descriptor set by.
func (h *handover) path() string { return fmt.Sprintf("/dev/fdset/%d", h.fdset) }

// uri is the migration URI of the handed-over file.
func (h *handover) uri() string {
	if h.fdset < 0 {
		return "fd:" + h.label
	}
	return "file:" + h.path()
}

// migrate sends cmd ("migrate" or "migrate-incoming") for the file.
func (h *handover) migrate(ctx context.Context, cmd string) error {
	err := h.m.qmp.Execute(ctx, cmd, map[string]string{"uri": h.uri()}, nil)
	if err == nil && h.fdset < 0 {
		h.taken = true
	}
	return err
}

// release takes the file back from QEMU: remove-fd of the set, or
// closefd of a named descriptor no migration took. QEMU's own duplicate
// stays open until its migration ends, so releasing a running migration's
// file does not stop it. It runs after ctx has ended too, does nothing the
// second time or once QEMU has exited, and logs what fails: the guest is
// not at stake, only a descriptor QEMU keeps.
func (h *handover) release(ctx context.Context) {
	if h == nil || h.released || h.taken || h.m.exitCtx.Err() != nil {
		return
	}
	m := h.m
	h.released = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	var err error
	if h.fdset >= 0 {
		err = m.qmp.Execute(ctx, "remove-fd", map[string]int64{"fdset-id": h.fdset}, nil)
	} else if err = m.qmp.Execute(ctx, "closefd", map[string]string{"fdname": h.label}, nil); errors.As(err, new(*qmp.Error)) {
		// Not found: a migration command cut off by its context took it.
		err = nil
	}
	if err != nil && m.exitCtx.Err() == nil {
		m.d.log.Warn("could not take a migration file back from QEMU; it keeps the descriptor open", "id", m.cfg.ID, "file", h.label, "err", err)
	}
}

// fdsetInfo is one entry of query-fdsets.
type fdsetInfo struct {
	ID  int64 `json:"fdset-id"`
	FDs []struct {
		FD     int    `json:"fd"`
		Opaque string `json:"opaque"`
	} `json:"fds"`
}

// dropStrayHandovers releases what a daemon that died mid-hand-over left
// in an adopted QEMU: every descriptor set (QEMU runs with none of its
// own: the driver passes no -add-fd), and the named descriptors of fd:
// hand-overs. A migration still running on one (an orphan live
// branch) keeps its own duplicate and goes on; its set disappears from
// query-fdsets when it ends.
func (m *Machine) dropStrayHandovers(ctx context.Context) error {
	var sets []fdsetInfo
	if err := m.qmp.Execute(ctx, "query-fdsets", nil, &sets); err != nil {
		return err
	}
	var errs []error
	for _, s := range sets {
		if len(s.FDs) == 0 {
			continue // only QEMU's duplicates left: its migration's
		}
		m.d.log.Info("removing a migration file the previous daemon left with QEMU", "id", m.cfg.ID, "fdset", s.ID, "file", s.FDs[0].Opaque)
		if err := m.qmp.Execute(ctx, "remove-fd", map[string]int64{"fdset-id": s.ID}, nil); err != nil {
			errs = append(errs, fmt.Errorf("remove-fd %d: %w", s.ID, err))
		}
	}
	// Whatever its version: a daemon older than the descriptor sets
	// passed every file by name.
	for _, name := range []string{stateFD, branchFD} {
		// Not found is the usual answer.
		if err := m.qmp.Execute(ctx, "closefd", map[string]string{"fdname": name}, nil); err != nil && !errors.As(err, new(*qmp.Error)) {
			errs = append(errs, fmt.Errorf("closefd %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
