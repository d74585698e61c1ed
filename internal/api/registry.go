package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// pullSnapshot fetches a snapshot artifact from an OCI registry as an
// operation (internal/oci): the daemon owns the data directory, knows
// which parts it has already (only the others are fetched) and applies
// its import policy (Server.TrustedKeys), as importArchive does. Push
// runs in the CLI instead, from an export: the signing key never leaves
// the client. A pull honours Idempotency-Key (a retry follows the same
// operation) and holds a build slot while it runs, as a snapshot create
// does: a flood of pulls is 429, not as many downloads and unpacks.
func (s *Server) pullSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.PullSnapshotRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	opts := oci.PullOptions{
		Unpack: pack.UnpackOptions{Tag: req.Tag, Force: req.Force, TrustedKeys: s.TrustedKeys},
		// Only the credentials the caller sent: never the daemon's own
		// docker logins.
		Auth:  oci.Auth{Username: req.Username, Password: req.Password, PlainHTTP: req.PlainHTTP, NoDockerConfig: true},
		Check: s.Engine.CanRestoreManifest,
	}
	// What fails at once is a plain 4xx, not a failed operation.
	if err := oci.CheckReference(req.Ref); err != nil {
		writeProblem(w, r, fmt.Errorf("ref: %w", err))
		return
	}
	if req.Tag != "" {
		if err := snapshot.ValidateNewTag(req.Tag); err != nil {
			writeProblem(w, r, err)
			return
		}
	}
	p := s.principalOf(r)
	// A tenant's pull must not make the daemon reach the host's or its
	// network's services: public registries only, unless the operator
	// listed this one. An admin (root on the socket) may pull from any.
	opts.Auth.PublicOnly = !p.Admin() && !slices.Contains(s.PrivateRegistries, oci.RegistryHost(req.Ref))
	if req.Force && !p.Admin() {
		writeProblem(w, r, fmt.Errorf("%s may not pull over existing tags (force): that needs the admin role; pull under a new tag (--tag) instead: %w", p, errdefs.ErrPermissionDenied))
		return
	}
	if req.VerifyKey != "" {
		key, err := pack.ParsePublicKey([]byte(req.VerifyKey))
		if err != nil {
			writeProblem(w, r, fmt.Errorf("verify_key: %w", err))
			return
		}
		opts.Unpack.VerifyKey = key
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
	tenant, quota := s.buildOwner(r)
	slot, err := s.Engine.TryAcquireBuild("pull "+req.Ref, tenant, quota)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	target := req.Tag
	if target == "" {
		target = req.Ref
	}
	op, err := s.startOperation(r, apiv1.OpSnapshotPull, target, func(ctx context.Context, pr opProgress) (any, error) {
		defer slot.Release()
		opts.Progress = pr.Message
		snap, stats, err := oci.Pull(ctx, s.Engine.Config().DataDir, req.Ref, opts)
		if err != nil {
			return nil, err
		}
		for _, id := range stats.Unpack.ReplacedIDs {
			s.Engine.DropPool(ctx, id)
		}
		pr.Message(fmt.Sprintf("pulled %s (%s): fetched %d of %d parts (%d bytes), %d here already",
			req.Ref, stats.Digest, len(stats.Fetched), len(stats.Fetched)+len(stats.Local), stats.FetchedBytes, len(stats.Local)))
		// The puller's tenant owns every tag the pull wrote, as for an import.
		for _, tag := range append(stats.Unpack.Added, stats.Unpack.Replaced...) {
			id := ""
			if a, err := s.Engine.Store().Get(tag); err == nil {
				id = a.ID
			}
			s.claimSnapshotFor(p, tag, id)
		}
		return s.snapshotInfoFor(p, snap), nil
	})
	if err != nil {
		slot.Release()
		writeProblem(w, r, err)
		return
	}
	claim.operation(op.ID)
	noteTargets(r, target)
	answer(op.ID)
}
