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

	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// Forks by registry reference. A fork whose tag is a reference
// (host[:port]/repository:tag or @digest, as `forkd push` wrote it) forks
// the snapshot pulled from it, pulling it on first use as `docker run`
// does: the snapshot is kept under a local tag derived from the
// reference and the caller's tenant (refTag), and later forks of the same
// reference use it without asking the registry again (a moved registry
// tag needs `forkd pull REF --tag T --force`). The pull is anonymous, and
// a tenant's reaches public registries only, as POST /v1/snapshots/pull.

// refPullTimeout bounds a pull made for a fork.
const refPullTimeout = 30 * time.Minute

// IsForkReference reports whether tag names a registry reference rather
// than a local tag: it has a repository path, which no tag can.
func IsForkReference(tag string) bool {
	return strings.Contains(tag, "/") && oci.CheckReference(tag) == nil
}

// CheckForkTag accepts a local tag or a registry reference (the CLI checks
// with it too); an invalid
// one gets the error of what it looks like (a path: a reference).
func CheckForkTag(tag string) error {
	if strings.Contains(tag, "/") {
		return oci.CheckReference(tag)
	}
	return snapshot.ValidateTag(tag)
}

// refTag is the local tag a reference is pulled under for tenant: the
// reference made tag-safe and cut to 46 characters, then 8 hex digits of
// a hash of tenant and reference, so two tenants (or two references that
// read alike once made safe) never share one.
func refTag(tenant, ref string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + ref))
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, ref)
	safe = strings.TrimLeft(safe, "._-")
	if len(safe) > 46 {
		safe = safe[:46]
	}
	if safe == "" {
		safe = "ref"
	}
	return safe + "-" + hex.EncodeToString(sum[:4])
}

// forkReference resolves a fork's reference to its local tag, pulling it
// first when this tenant has not yet. Concurrent forks of one reference
// share one pull, which runs to its end even if the fork that started it
// goes away (the next fork uses it).
func (s *Server) forkReference(r *http.Request, ref string) (string, error) {
	p := s.principalOf(r)
	tag := refTag(auth.TenantOf(p.Tenant), ref)
	if _, err := s.Engine.Store().Get(tag); err == nil {
		return tag, nil
	}
	tenant, quota := s.buildOwner(r)
	ch := s.refPulls.DoChan(tag, func() (any, error) {
		if _, err := s.Engine.Store().Get(tag); err == nil {
			return nil, nil // pulled by a fork that finished just before
		}
		slot, err := s.Engine.TryAcquireBuild("pull "+ref+" for a fork", tenant, quota)
		if err != nil {
			return nil, err
		}
		defer slot.Release()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), refPullTimeout)
		defer cancel()
		opts := oci.PullOptions{
			Unpack: pack.UnpackOptions{Tag: tag, TrustedKeys: s.TrustedKeys},
			Auth: oci.Auth{NoDockerConfig: true,
				PublicOnly: !p.Admin() && !slices.Contains(s.PrivateRegistries, oci.RegistryHost(ref))},
			Check: s.Engine.CanRestoreManifest,
		}
		_, stats, err := oci.Pull(ctx, s.Engine.Config().DataDir, ref, opts)
		if err != nil {
			return nil, err
		}
		if s.Log != nil {
			s.Log.Info("pulled a snapshot for a fork", "ref", ref, "tag", tag, "digest", stats.Digest, "fetched_bytes", stats.FetchedBytes)
		}
		for _, t := range append(stats.Unpack.Added, stats.Unpack.Replaced...) {
			id := ""
			if a, err := s.Engine.Store().Get(t); err == nil {
				id = a.ID
			}
			s.claimSnapshotFor(p, t, id)
		}
		return nil, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return "", fmt.Errorf("fork of %s: pull: %w", ref, res.Err)
		}
		return tag, nil
	case <-r.Context().Done():
		return "", r.Context().Err()
	}
}
