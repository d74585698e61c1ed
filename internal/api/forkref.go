package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
)

// Forks by registry reference. A fork whose tag is a reference
// (host[:port]/repository:tag or @digest, as `forkd push` wrote it) forks
// the snapshot pulled from it, pulled for the caller's tenant as POST
// /v1/snapshots/pull would (a build slot, the caller's credentials or
// none, public registries only for a tenant) under a tag derived from the
// tenant and the reference (ReferenceTag), in the namespace no other path may
// create a tag in (snapshot.ReservedTagPrefix). The snapshot's ownership
// record also names its origin (reference and manifest digest), and a
// held copy is used only when that record is this tenant's, for this
// reference, for this very snapshot, and for a digest reference has that
// digest: a tenant never forks a snapshot another tenant put there.
//
// Freshness follows the fork's pull_policy: if_not_present (the default)
// uses the held copy without asking the registry, as `docker run` does;
// always asks the registry for the digest and pulls when it moved.
// Concurrent forks of one reference by one tenant share one pull
// (singleflight), which runs to its end even if the fork that started it
// goes away (the next fork uses it).

// refPullTimeout bounds a pull made for a fork.
const refPullTimeout = 30 * time.Minute

// refHashHex is how many hex digits of the hash of tenant and reference
// a derived tag carries: 96 bits.
const refHashHex = 24

// ReferenceTag is the local tag the reference ref is pulled under for
// tenant: the reserved prefix, a readable hint (the repository's last
// component and the tag or digest, made tag-safe) and 96 bits of a hash
// of tenant and ref, which alone tell two tenants or two references
// apart. Exported for the integration tests.
func ReferenceTag(tenant string, ref oci.Reference) string {
	sum := sha256.Sum256([]byte(auth.TenantOf(tenant) + "\x00" + ref.String()))
	name := ref.Repository[strings.LastIndex(ref.Repository, "/")+1:]
	if ref.Digest != "" {
		_, hexd, _ := strings.Cut(ref.Digest, ":")
		name += "-" + hexd[:min(12, len(hexd))]
	} else {
		name += "-" + ref.Tag
	}
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, name)
	room := 64 - len(snapshot.ReservedTagPrefix) - 1 - refHashHex
	if len(safe) > room {
		safe = safe[:room]
	}
	return snapshot.ReservedTagPrefix + safe + "-" + hex.EncodeToString(sum[:])[:refHashHex]
}

// checkPullPolicy checks a fork's pull_policy: one of apiv1.PullPolicies,
// and only with a reference.
func checkPullPolicy(req apiv1.ForkRequest) error {
	isRef := oci.IsReference(req.Tag)
	switch {
	case req.PullPolicy != "" && !slices.Contains(apiv1.PullPolicies, req.PullPolicy):
		return fmt.Errorf("pull_policy %q: want %s: %w", req.PullPolicy, strings.Join(apiv1.PullPolicies, " or "), errdefs.ErrInvalidArgument)
	case !isRef && (req.PullPolicy != "" || req.RegistryUsername != "" || req.RegistryPassword != ""):
		return fmt.Errorf("pull_policy and registry credentials apply to a fork by registry reference (host[:port]/repository:tag), and %q is a local tag: drop them: %w", req.Tag, errdefs.ErrInvalidArgument)
	}
	return nil
}

// refPull is one fork's request for the snapshot of a reference.
type refPull struct {
	p      auth.Principal
	tenant string // auth.TenantOf(p.Tenant)
	ref    oci.Reference
	tag    string // ReferenceTag(tenant, ref)
	policy string
	auth   oci.Auth
}

// forkReference resolves a fork's reference to the local tag of the
// caller's copy, pulling it first when the policy says so.
func (s *Server) forkReference(r *http.Request, req apiv1.ForkRequest) (string, error) {
	ref, err := oci.ParseReference(req.Tag)
	if err != nil {
		return "", err
	}
	p := s.principalOf(r)
	rp := refPull{p: p, tenant: auth.TenantOf(p.Tenant), ref: ref, policy: req.PullPolicy,
		auth: oci.Auth{Username: req.RegistryUsername, Password: req.RegistryPassword, NoDockerConfig: true,
			// A tenant's pull must not make the daemon reach the host's
			// or its network's services, as for POST /v1/snapshots/pull.
			PublicOnly: !p.Admin() && !slices.Contains(s.PrivateRegistries, ref.Registry)}}
	rp.tag = ReferenceTag(rp.tenant, ref)
	if rp.policy == "" {
		rp.policy = apiv1.PullIfNotPresent
	}
	if _, held := s.heldReference(rp); held && rp.policy == apiv1.PullIfNotPresent {
		return rp.tag, nil
	}
	buildTenant, quota := s.buildOwner(r)
	ch := s.refPulls.DoChan(rp.tag, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), refPullTimeout)
		defer cancel()
		return nil, s.pullReference(ctx, rp, buildTenant, quota)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return "", fmt.Errorf("fork of %s: %w", ref, res.Err)
		}
		return rp.tag, nil
	case <-r.Context().Done():
		return "", fmt.Errorf("fork of %s: gave up waiting for its pull (which goes on; the next fork uses it): %w", ref, context.Cause(r.Context()))
	}
}

// heldReference reports whether rp's tag holds a copy of rp's reference
// pulled for rp's tenant (its ownership record says so, for the snapshot
// under the tag now), and the manifest digest it was pulled at. A copy
// whose record does not match is not held: the next pull replaces it.
func (s *Server) heldReference(rp refPull) (digest string, held bool) {
	snap, err := s.Engine.Store().Get(rp.tag)
	if err != nil {
		return "", false
	}
	tenant, origin, ok := s.owners.origin(rp.tag, snap.ID)
	if !ok || tenant != rp.tenant || origin.Ref != rp.ref.String() || (rp.ref.Digest != "" && origin.Digest != rp.ref.Digest) {
		return "", false
	}
	return origin.Digest, true
}

// pullReference pulls rp's reference under rp's tag unless a copy held
// there will do (if_not_present: any; always: one at the registry's
// digest now), holding a build slot of buildTenant's while it pulls.
func (s *Server) pullReference(ctx context.Context, rp refPull, buildTenant string, quota sandbox.TenantQuota) error {
	if digest, held := s.heldReference(rp); held {
		if rp.policy == apiv1.PullIfNotPresent || rp.ref.Digest != "" {
			return nil // pulled by a fork that finished just before, or a digest: it cannot move
		}
		now, err := oci.Resolve(ctx, rp.ref.String(), rp.auth)
		if err != nil {
			return err
		}
		if now == digest {
			return nil
		}
	}
	slot, err := s.Engine.TryAcquireBuild("pull "+rp.ref.String()+" for a fork", buildTenant, quota)
	if err != nil {
		return err
	}
	defer slot.Release()
	opts := oci.PullOptions{
		// ReplaceHead: a copy there that did not do (moved at the
		// registry, or its record lost) gives way; ancestors never do.
		Unpack: pack.UnpackOptions{Tag: rp.tag, ReservedTag: true, ReplaceHead: true, TrustedKeys: s.TrustedKeys},
		Auth:   rp.auth,
		Check:  s.Engine.CanRestoreManifest,
	}
	snap, stats, err := oci.Pull(ctx, s.Engine.Config().DataDir, rp.ref.String(), opts)
	if err != nil {
		return err
	}
	for _, id := range stats.Unpack.ReplacedIDs {
		s.Engine.DropPool(ctx, id)
	}
	// The puller's tenant owns what the pull wrote: the ancestors a layer
	// brought under their own tags, and the head with its origin.
	for _, t := range append(stats.Unpack.Added, stats.Unpack.Replaced...) {
		if t == rp.tag {
			continue
		}
		id := ""
		if a, err := s.Engine.Store().Get(t); err == nil {
			id = a.ID
		}
		s.claimSnapshotFor(rp.p, t, id)
	}
	if err := s.owners.claimOrigin(rp.tag, rp.tenant, snap.ID, state.SnapshotOrigin{Ref: rp.ref.String(), Digest: stats.Digest}); err != nil {
		return fmt.Errorf("pulled %s as %s, but recording its origin failed (the next fork pulls it again): %w", rp.ref, rp.tag, err)
	}
	if s.Log != nil {
		s.Log.Info("pulled a snapshot for a fork", "ref", rp.ref.String(), "tag", rp.tag, "digest", stats.Digest, "fetched_bytes", stats.FetchedBytes)
	}
	return nil
}
