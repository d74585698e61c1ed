package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"syscall"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// snapshotInfo renders a snapshot for the principal of r: its owner, and
// only the tags of its chain r may see (scopeSnapshotView).
func (s *Server) snapshotInfo(r *http.Request, snap *snapshot.Snapshot) apiv1.Snapshot {
	return s.snapshotInfoFor(s.principalOf(r), snap)
}

// snapshotInfoFor is snapshotInfo for principal p (daemon-owned work,
// which outlives its request).
func (s *Server) snapshotInfoFor(p auth.Principal, snap *snapshot.Snapshot) apiv1.Snapshot {
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
	s.scopeSnapshotView(p, &out)
	return out
}

// pendingView is pendingInfo for the principal of r.
func (s *Server) pendingView(r *http.Request, p sandbox.PendingSnapshot) apiv1.Snapshot {
	out := pendingInfo(p)
	s.scopeSnapshotView(s.principalOf(r), &out)
	return out
}

// listSnapshots lists the snapshots r's tenant owns or is shared (all of
// them for an admin), those being written included, a page at a time
// (paging.go), by tag.
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
	writePage(w, r, out, snapshotOrder)
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

// createSnapshot builds a snapshot, owned by r's tenant, as an operation
// (operation_run.go): with Prefer: respond-async (or ?async=true) it
// answers 202 with the operation; without, it follows the operation and
// answers the NDJSON progress stream it answered before operations
// existed (X-Forkd-Operation names the operation). Either way the work is
// the daemon's: a client that goes away does not stop it.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CreateSnapshotRequest
	if err := decodeUpTo(w, r, &req, MaxBuildBody); err != nil {
		writeProblem(w, r, err)
		return
	}
	answer, err := s.operationAnswer(w, r, func(opID string) { s.followAsProgress(w, r, opID) })
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	claim, ok := s.claimIdempotency(w, r, req, answer)
	if !ok {
		return
	}
	defer claim.release()
	opts := sandbox.CreateSnapshotOptions{
		Tag: req.Tag, Recipe: req.Recipe, RecipeTOML: req.RecipeTOML, Warm: req.Warm, MemoryMiB: req.MemoryMiB, VCPUs: req.VCPUs,
		Network: policyOf(req.Network), BuildNetwork: policyOf(req.BuildNetwork),
	}
	admin := s.principalOf(r).Admin()
	if needsParse(req.BuildSource) || (!admin && req.RecipeTOML != "") {
		// A Dockerfile, an image reference or a build context, or a
		// tenant's recipe (whose from decides how it is pulled): read
		// as an image build reads them.
		rcp, err := s.buildRecipe(req.BuildSource)
		if err != nil {
			writeProblem(w, r, err)
			return
		}
		opts.Parsed, opts.Recipe, opts.RecipeTOML = rcp, "", ""
		opts.Registry = s.registryAccess(r, req.BuildSource, rcp.From)
	} else {
		opts.Registry = s.registryAccess(r, req.BuildSource, "")
	}
	// Validate everything that can be checked before starting the work
	// (tag, recipe, memory, vCPUs, warm-up code, networks, disk space),
	// and take the build slot, so bad input is a plain 4xx and a full
	// daemon (or a tenant at its bound of builds) a 429 with Retry-After,
	// not an operation that fails at once.
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
	opts.Slot = slot
	p := s.principalOf(r)
	create := s.createSnapshotFn
	if create == nil {
		create = s.Engine.CreateSnapshot
	}
	op, err := s.startOperation(r, apiv1.OpSnapshotCreate, req.Tag, func(ctx context.Context, pr opProgress) (any, error) {
		opts.Progress = pr.Message
		snap, err := create(ctx, opts)
		if err != nil {
			return nil, err
		}
		s.claimSnapshotFor(p, snap.Tag, snap.ID)
		return s.snapshotInfoFor(p, snap), nil
	})
	if err != nil {
		slot.Release()
		writeProblem(w, r, err)
		return
	}
	claim.operation(op.ID)
	noteTargets(r, req.Tag)
	answer(op.ID)
}

// registryAccess is how a build for r's principal pulls its from image
// (from: the reference, "" when unknown or none). An admin's build uses
// the credentials it sent, else the daemon's docker config, at any
// address; so does a recipe the daemon has installed, which is the
// operator's choice. Anyone else's build uses only the credentials it
// sent (never the daemon's logins) and reaches public registries only,
// unless the operator allowed this one (--registry-private).
func (s *Server) registryAccess(r *http.Request, src apiv1.BuildSource, from string) image.RegistryAccess {
	var a image.RegistryAccess
	if src.RegistryUsername != "" || src.RegistryPassword != "" {
		a.Keychain = image.StaticCredentials(src.RegistryUsername, src.RegistryPassword)
	}
	installed := src.Recipe != "" && src.RecipeTOML == ""
	if s.principalOf(r).Admin() || installed || from == "" {
		return a
	}
	if a.Keychain == nil {
		a.Keychain = image.StaticCredentials("", "")
	}
	a.PublicOnly = !slices.Contains(s.PrivateRegistries, oci.RegistryHost(from))
	return a
}

// needsParse reports whether a snapshot's build source is more than a
// recipe name or TOML (which the engine resolves itself).
func needsParse(src apiv1.BuildSource) bool {
	return src.From != "" || src.Dockerfile != "" || src.Name != "" || len(src.BuildArgs) > 0 || len(src.Context) > 0 || src.InsecureRegistry
}

// followAsProgress answers with an operation that writes a snapshot as
// the NDJSON progress stream (apiv1.Progress lines): its progress so far
// and as it comes, then the snapshot or the problem. It follows on r's
// context: a client that goes away ends the stream, not the operation.
func (s *Server) followAsProgress(w http.ResponseWriter, r *http.Request, opID string) {
	w.Header().Set(apiv1.OperationHeader, opID)
	ps := newProgressStream(w)
	first := true
	ctx, done := s.streamContext(r)
	defer done()
	s.ops.follow(ctx, opID, func(ev apiv1.OperationEvent) error {
		op := ev.Operation
		switch {
		case op == nil:
			if ev.Message != "" {
				ps.message(ev.Message)
			}
			return nil
		case first:
			first = false
			for _, msg := range op.Progress {
				ps.message(msg)
			}
		}
		switch op.State {
		case apiv1.OpSucceeded:
			var snap apiv1.Snapshot
			if err := json.Unmarshal(op.Result, &snap); err != nil {
				return err
			}
			ps.send(apiv1.Progress{Snapshot: &snap})
		case apiv1.OpFailed, apiv1.OpCancelled:
			err := opError(*op)
			noteError(r, err)
			p := ProblemOf(err, requestID(r))
			ps.send(apiv1.Progress{Error: &p})
		}
		return nil
	})
}

// claimSnapshot records a tag r just created as its tenant's.
func (s *Server) claimSnapshot(r *http.Request, tag, id string) {
	s.claimSnapshotFor(s.principalOf(r), tag, id)
}

// claimSnapshotFor records a tag as p's tenant's.
func (s *Server) claimSnapshotFor(p auth.Principal, tag, id string) {
	if err := s.owners.claim(tag, p.Tenant, id); err != nil && s.Log != nil {
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

// compactSnapshot writes a flat copy of a chain head under a new tag, as
// an operation: 202 with it when asked (wantsAsync), else 201 with the
// snapshot once written (the copy goes on if the client goes away).
func (s *Server) compactSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CompactRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	answer, err := s.operationAnswer(w, r, func(opID string) { s.awaitResult(w, r, opID, http.StatusCreated) })
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	claim, ok := s.claimIdempotency(w, r, req, answer)
	if !ok {
		return
	}
	defer claim.release()
	from, p := r.PathValue("tag"), s.principalOf(r)
	// What fails at once is a plain 4xx, not a failed operation.
	if _, err := s.Engine.Store().Get(from); err != nil {
		writeProblem(w, r, s.scopeSnapshotErr(p, from, err))
		return
	}
	if err := s.Engine.Store().CheckFree(req.To); err != nil {
		writeProblem(w, r, err)
		return
	}
	op, err := s.startOperation(r, apiv1.OpSnapshotCompact, req.To, func(ctx context.Context, _ opProgress) (any, error) {
		snap, err := s.Engine.CompactFor(ctx, from, req.To, auth.TenantOf(p.Tenant))
		if err != nil {
			return nil, s.scopeSnapshotErr(p, from, err)
		}
		s.claimSnapshotFor(p, snap.Tag, snap.ID)
		return s.snapshotInfoFor(p, snap), nil
	})
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	claim.operation(op.ID)
	noteTargets(r, req.To)
	answer(op.ID)
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
