package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// snapshotInfo renders a snapshot for the principal of r: its owner, and
// only the tags of its chain r may see (scopeSnapshotView).
func (s *Server) snapshotInfo(r *http.Request, snap *snapshot.Snapshot) apiv1.Snapshot {
	out := apiv1.Snapshot{
		Tag: snap.Tag, ID: snap.ID, Created: snap.Created, Recipe: snap.Image.Recipe, ImageDigest: snap.Image.Digest,
		VMM: snap.VMM.Kind, VMMVersion: snap.VMM.Version, Accel: snap.VMM.Accel,
		MemoryMiB: snap.MemoryMiB, VCPUs: snap.VCPUs, CPUs: float64(snap.CPUMillicores) / 1000, Python: snap.Python.Enabled,
		Files: map[string]apiv1.FileEntry{}, CreateMillis: snap.CreateMillis,
		Pooled: s.Engine.PoolSize(snap.ID), State: apiv1.SnapshotReady,
	}
	s.chainInfo(snap, &out)
	for name, f := range snap.Files {
		out.Files[name] = apiv1.FileEntry{Size: f.Size, SHA256: f.SHA256}
		out.SizeBytes += f.Size
		var st syscall.Stat_t
		if syscall.Stat(snap.Path(name), &st) == nil {
			out.DiskBytes += st.Blocks * 512
		}
	}
	s.scopeSnapshotView(s.principalOf(r), &out)
	return out
}

// pendingView is pendingInfo for the principal of r.
func (s *Server) pendingView(r *http.Request, p sandbox.PendingSnapshot) apiv1.Snapshot {
	out := pendingInfo(p)
	s.scopeSnapshotView(s.principalOf(r), &out)
	return out
}

// listSnapshots lists the snapshots r's tenant owns or is shared (all of
// them for an admin), those being written included.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	p := s.principalOf(r)
	snaps, err := s.Engine.Store().List()
	if err != nil && len(snaps) == 0 {
		writeProblem(w, r, s.scopeSnapshotErr(p, "", err))
		return
	}
	out := []apiv1.Snapshot{}
	for _, snap := range snaps {
		if p.Admin() || s.snapshotAccess(p, snap.Tag).seen {
			out = append(out, s.snapshotInfo(r, snap))
		}
	}
	for _, pend := range s.Engine.PendingList() {
		if p.Admin() || s.snapshotAccess(p, pend.Tag).seen {
			out = append(out, s.pendingView(r, pend))
		}
	}
	writeJSON(w, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	tag := r.PathValue("tag")
	snap, err := s.Engine.Store().Get(tag)
	if err != nil {
		if pend, ok := s.Engine.Pending(tag); ok {
			writeJSON(w, s.pendingView(r, pend))
			return
		}
		// A background branch commits before it stops being pending:
		// look again, in case it did so between the two lookups.
		if snap, err = s.Engine.Store().Get(tag); err != nil {
			writeProblem(w, r, s.scopeSnapshotErr(s.principalOf(r), tag, err))
			return
		}
	}
	writeJSON(w, s.snapshotInfo(r, snap))
}

// createSnapshot builds a snapshot, owned by r's tenant.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CreateSnapshotRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	opts := sandbox.CreateSnapshotOptions{
		Tag: req.Tag, Recipe: req.Recipe, RecipeTOML: req.RecipeTOML, Warm: req.Warm, MemoryMiB: req.MemoryMiB, VCPUs: req.VCPUs,
		Network: policyOf(req.Network),
	}
	// Validate everything that can be checked before committing to a
	// stream (tag, recipe, memory, vCPUs, warm-up code, disk space), and
	// take the build slot, so bad input is a plain 4xx and a full daemon
	// (or a tenant at its bound of builds) a 429 with Retry-After, not a
	// 200 that fails later.
	if err := s.Engine.CheckCreateSnapshot(opts); err != nil {
		writeProblem(w, r, err)
		return
	}
	opts.Tenant, opts.Quota = s.buildOwner(r)
	slot, err := s.Engine.TryAcquireBuild("create snapshot "+req.Tag, opts.Tenant, opts.Quota)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	ps := newProgressStream(w)
	opts.Progress, opts.Slot = ps.message, slot
	snap, err := s.Engine.CreateSnapshot(r.Context(), opts)
	if err != nil {
		noteError(r, err)
		p := ProblemOf(err, requestID(r))
		ps.send(apiv1.Progress{Error: &p})
		return
	}
	s.claimSnapshot(r, snap.Tag, snap.ID)
	noteTargets(r, snap.Tag)
	info := s.snapshotInfo(r, snap)
	ps.send(apiv1.Progress{Snapshot: &info})
}

// claimSnapshot records a tag r just created as its tenant's.
func (s *Server) claimSnapshot(r *http.Request, tag, id string) {
	if err := s.owners.claim(tag, s.principalOf(r).Tenant, id); err != nil && s.Log != nil {
		s.Log.Error("recording a snapshot's owner failed: after a restart it belongs to the default tenant", "tag", tag, "err", err)
	}
}

// chainInfo fills in where a snapshot sits in its chain.
func (s *Server) chainInfo(snap *snapshot.Snapshot, out *apiv1.Snapshot) {
	out.Depth = snap.Depth
	if snap.Parent != nil {
		out.Parent = &apiv1.ParentRef{Tag: snap.Parent.Tag, Digest: snap.Parent.Digest}
		out.Ancestors = s.Engine.Store().Ancestors(snap)
		// A layer whose chain broke (an ancestor removed with --force, or
		// replaced) cannot be forked: say so where clients look.
		if _, err := s.Engine.Store().Chain(snap); err != nil {
			out.State, out.Error = apiv1.SnapshotFailed, err.Error()
		}
	}
	if deps, err := s.Engine.Store().Dependents(snap.Tag); err == nil && len(deps) > 0 {
		out.Dependents = deps
	}
	// A file changed since it was written (stamps differ): forks are
	// refused, so clients see it as failed, with the reason.
	if out.State != apiv1.SnapshotFailed {
		if err := s.Engine.SnapshotIntact(snap); err != nil {
			out.State, out.Error = apiv1.SnapshotFailed, err.Error()
		}
	}
}

// deleteSnapshot removes a tag; ?cascade=true also removes the layers
// built on it, ?force=true removes it alone (its layers stop working). It
// answers with every tag it removed.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	var opts sandbox.RemoveOptions
	for name, dst := range map[string]*bool{"cascade": &opts.Cascade, "force": &opts.Force} {
		b, err := httpquery.Bool(r.URL.Query(), name, false)
		if err != nil {
			writeProblem(w, r, err)
			return
		}
		*dst = b
	}
	tag := r.PathValue("tag")
	if err := s.checkDependents(s.principalOf(r), tag); err != nil {
		writeProblem(w, r, err)
		return
	}
	removed, err := s.Engine.RemoveSnapshotWith(r.Context(), tag, opts)
	s.owners.forget(removed...)
	noteTargets(r, removed...)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, apiv1.RemovedSnapshots{Removed: removed})
}

// checkDependents refuses a non-admin the removal of a snapshot that
// layers of other tenants build on, without naming them: removing it
// (cascade, force) would remove or break their snapshots.
func (s *Server) checkDependents(p auth.Principal, tag string) error {
	if p.Admin() {
		return nil
	}
	deps, err := s.Engine.Store().Dependents(tag)
	if err != nil {
		return nil // the engine's removal says what is wrong
	}
	for _, d := range deps {
		if !s.snapshotAccess(p, d).owned {
			return fmt.Errorf("snapshot %q is the base of layers other tenants made (they forked it while it was shared): only an admin can remove it; unshare it to stop new ones: %w",
				tag, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// compactSnapshot writes a flat copy of a chain head under a new tag.
func (s *Server) compactSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CompactRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	snap, err := s.Engine.Compact(r.Context(), r.PathValue("tag"), req.To)
	if err != nil {
		writeProblem(w, r, s.scopeSnapshotErr(s.principalOf(r), r.PathValue("tag"), err))
		return
	}
	s.claimSnapshot(r, snap.Tag, snap.ID)
	noteTargets(r, snap.Tag)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(s.snapshotInfo(r, snap))
}

// pendingInfo describes a tag a background branch is writing (or failed
// to write): only its tag, state and error are known.
func pendingInfo(p sandbox.PendingSnapshot) apiv1.Snapshot {
	out := apiv1.Snapshot{Tag: p.Tag, Created: p.Started.UTC(), State: apiv1.SnapshotWriting, Files: map[string]apiv1.FileEntry{}}
	if p.State == sandbox.PendingFailed {
		out.State = apiv1.SnapshotFailed
		if p.Err != nil {
			out.Error = p.Err.Error()
		}
	}
	return out
}
