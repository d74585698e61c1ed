package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Branch modes (vmm snapshot types of a running sandbox).
const (
	BranchDiff = string(vmm.SnapshotDiff) // pause, copy the pages the sandbox wrote
	BranchFull = string(vmm.SnapshotFull) // a self-contained copy of its memory; the pause is a diff's
	BranchLive = string(vmm.SnapshotLive) // keep running; memory captured as of the branch instant
)

// maxConcurrentBranches bounds branches in flight: each holds a pause or a
// write-protected guest and writes hundreds of MB.
const maxConcurrentBranches = 2

// BranchOptions say what to branch into.
type BranchOptions struct {
	Tag  string
	Mode string // BranchDiff (default), BranchFull or BranchLive
	// Tenant will own the new snapshot: its events are that tenant's to
	// see ("": the source sandbox's tenant).
	Tenant string
}

// eventTenant is who sees the events of a branch of sandbox id.
func (e *Engine) eventTenant(id string, opts BranchOptions) string {
	if opts.Tenant != "" {
		return opts.Tenant
	}
	if s, err := e.Get(id); err == nil {
		return s.Tenant
	}
	return ""
}

// BranchResult is a branch's outcome.
type BranchResult struct {
	Snapshot     *snapshot.Snapshot
	Paused       time.Duration
	BytesWritten int64
	Duration     time.Duration
}

// Branch snapshots a running sandbox into a new tag that forks like any
// other: grandchildren see the sandbox's memory, processes and files at the
// branch instant. The source always resumes, whatever fails (the driver
// guarantees it); a failed branch leaves no tag.
func (e *Engine) Branch(ctx context.Context, id string, opts BranchOptions) (*BranchResult, error) {
	if opts.Mode == "" {
		opts.Mode = BranchDiff
	}
	if err := e.checkBranch(id, &opts); err != nil {
		return nil, err
	}
	tenant := e.eventTenant(id, opts)
	res, err := e.branch(ctx, id, opts)
	if err == nil {
		e.emit(Event{Kind: EventSnapshotCreated, SandboxID: id, Tag: opts.Tag, Tenant: tenant, Reason: "branch " + string(opts.Mode)})
	}
	return res, err
}

// checkBranch validates a branch request: mode, tag free (not committed,
// not pending), sandbox running.
func (e *Engine) checkBranch(id string, opts *BranchOptions) error {
	switch opts.Mode {
	case BranchDiff, BranchFull, BranchLive:
	default:
		return fmt.Errorf("branch mode %q: use diff, full or live: %w", opts.Mode, errdefs.ErrInvalidArgument)
	}
	if err := e.store.CheckFree(opts.Tag); err != nil {
		return err
	}
	if _, ok := e.Pending(opts.Tag); ok {
		return fmt.Errorf("snapshot %q already exists (a branch is being written to it, or failed; see its state): %w", opts.Tag, errdefs.ErrAlreadyExists)
	}
	s, err := e.Get(id)
	if err != nil {
		return err
	}
	if _, err := s.client(); err != nil {
		return err // not running: says why
	}
	// A live branch the host cannot take is refused now, not reported
	// later as a failed background branch.
	if ls, ok := s.machine.(vmm.LiveBrancher); ok && opts.Mode == BranchLive {
		if err := ls.LiveBranchSupport(); err != nil {
			return fmt.Errorf("live branch of sandbox %s: %w", id, err)
		}
	}
	return nil
}

// branch does the work of Branch once the request was checked.
func (e *Engine) branch(ctx context.Context, id string, opts BranchOptions) (_ *BranchResult, err error) {
	start := time.Now()
	s, err := e.Get(id)
	if err != nil {
		return nil, err
	}
	// A branch is a request on its source: the idle timeout must not end
	// the sandbox in the middle of one (a live or --no-wait branch can
	// take minutes).
	_, release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	select {
	case e.branchSem <- struct{}{}:
		defer func() { <-e.branchSem }()
	default:
		return nil, fmt.Errorf("%d branches already running; retry shortly: %w", cap(e.branchSem), errdefs.ErrUnavailable)
	}
	// A diff branch is a layer on the snapshot the sandbox was forked
	// from (see chain.go), as long as the chain stays within its limit.
	layer := opts.Mode == BranchDiff
	parent, err := e.branchBase(s, layer)
	if err != nil {
		return nil, err
	}
	if layer && parent.Depth+1 > snapshot.MaxChainDepth {
		return nil, fmt.Errorf("sandbox %s runs on %q, a chain of %d layers, the limit: branch with --mode full, or compact it (forkd snapshot compact --from %s --to NEW) and fork from that: %w",
			id, parent.Tag, parent.Depth, parent.Tag, errdefs.ErrFailedPrecondition)
	}
	if layer {
		// The layer's parent must still be whole: a branch on a broken
		// chain could never be forked.
		if _, err := e.store.Chain(parent); err != nil {
			return nil, err
		}
	}
	if err := e.checkBranchSpace(id, parent, opts.Mode); err != nil {
		return nil, err
	}
	st, err := e.store.Stage(opts.Tag)
	if err != nil {
		return nil, err
	}
	defer st.Abort()
	s.touch()
	spec := vmm.SnapshotSpec{
		Type:       vmm.SnapshotType(opts.Mode),
		StateFile:  st.Path(snapshot.StateFile),
		MemoryFile: st.Path(snapshot.MemoryFile),
	}
	if layer {
		spec.Layer, spec.PageIndexFile = true, st.Path(snapshot.LayerIndexFile)
	}
	res, err := s.machine.Snapshot(ctx, spec)
	if err != nil {
		return nil, e.explainNoSpace(fmt.Errorf("branch %s of sandbox %s: %w", opts.Mode, id, err), "branch "+opts.Tag)
	}
	e.cfg.Metrics.ObserveBranch(opts.Mode, res.Paused, res.BytesWritten)
	m := parent.Manifest
	m.ID, m.Created, m.Files = "", time.Time{}, nil
	if s.net != nil {
		// The branch's children keep the source's policy, as it is now.
		p := s.net.Policy()
		m.Network.Policy = &p
	}
	m.Parent, m.Depth, m.CompactedFrom = nil, 0, ""
	if layer {
		m.Parent = &snapshot.ParentRef{Tag: parent.Tag, Digest: parent.Digest()}
		m.Depth = parent.Depth + 1
	}
	m.Branch = &snapshot.BranchRef{
		SandboxID: id, FromTag: parent.Tag, FromSnapshotID: parent.ID, Mode: opts.Mode,
		PauseMicros: res.Paused.Microseconds(), BytesWritten: res.BytesWritten,
	}
	m.CreateMillis = time.Since(start).Milliseconds()
	snap, err := st.Commit(m)
	if err != nil {
		if layer && errdefs.IsFailedPrecondition(err) {
			// The parent went while the layer was written (the store
			// checks it under the chains lock as it commits).
			return nil, fmt.Errorf("branch %s of sandbox %s (a full branch, --mode full, needs no parent): %w", opts.Mode, id, err)
		}
		return nil, e.explainNoSpace(err, "branch "+opts.Tag)
	}
	// Start VMMs for the new tag now (and, for a layer, assemble its
	// memory image), so the first fork from it is as fast as any.
	e.poolFor(snap).refill()
	return &BranchResult{Snapshot: snap, Paused: res.Paused, BytesWritten: res.BytesWritten, Duration: time.Since(start)}, nil
}

// checkBranchSpace checks, before the sandbox is paused, that the store's
// file system can take what a branch of a sandbox forked from parent may
// write: a full branch copies its whole memory, a diff branch at most
// that much (every page written), a live branch spools the whole
// migration stream and then splits it into a memory file (twice that).
func (e *Engine) checkBranchSpace(id string, parent *snapshot.Snapshot, mode string) error {
	mem := parent.Files[snapshot.MemoryFile].Size
	if mem == 0 {
		mem = int64(parent.MemoryMiB) << 20
	}
	need := mem
	if mode == BranchLive {
		need = 2 * mem
	}
	return checkFreeSpace(e.store.Root(), need+spaceMargin,
		fmt.Sprintf("%s branch of sandbox %s (%s of guest memory)", mode, id, mib(mem)))
}

// branchBase is the snapshot a branch of s builds on. A layer needs the
// very snapshot s was forked from, in the store. A full or live branch
// only needs its manifest (shape, image, recipe), which s keeps, so it
// works after the tag was removed or replaced; the snapshot returned then
// is that manifest alone, with no files on disk.
func (e *Engine) branchBase(s *Sandbox, layer bool) (*snapshot.Snapshot, error) {
	snap, err := e.snapshotByID(s.Tag, s.SnapshotID)
	gone := errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err)
	switch {
	case err == nil:
		return snap, nil
	case gone && !layer && s.base != nil:
		return &snapshot.Snapshot{Manifest: *s.base}, nil
	case gone && layer:
		return nil, fmt.Errorf("sandbox %s was forked from snapshot %q, which has been removed or replaced since, and a diff branch is a layer on it: branch with --mode full (or live) instead: %w",
			s.ID, s.Tag, errdefs.ErrFailedPrecondition)
	}
	return nil, err
}

// snapshotByID returns the snapshot a sandbox was forked from, checking it
// is still the same one (a tag can be removed and reused).
func (e *Engine) snapshotByID(tag, id string) (*snapshot.Snapshot, error) {
	snap, err := e.store.Get(tag)
	if err != nil {
		return nil, fmt.Errorf("the snapshot this sandbox was forked from: %w", err)
	}
	if snap.ID != id {
		return nil, fmt.Errorf("snapshot %q was replaced since this sandbox was forked from it: %w", tag, errdefs.ErrFailedPrecondition)
	}
	return snap, nil
}
