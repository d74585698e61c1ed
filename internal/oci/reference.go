package oci

import (
	"context"
	"fmt"
	"strings"

	"oras.land/oras-go/v2/registry"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// References as forks name them. A fork's source is a local tag or a
// registry reference; a tag never holds a '/', a reference always does.

// Reference is a registry reference in its normal form: the registry host
// in lowercase, and a digest alone when both a tag and a digest are given
// (the digest is what is fetched; the tag is only a comment then).
type Reference struct {
	Registry   string // host or host:port, lowercase
	Repository string
	Tag        string // empty when Digest is set
	Digest     string // sha256:... when the reference pins one
}

// String is the normal form: host[:port]/repository:tag or
// host[:port]/repository@digest.
func (r Reference) String() string {
	if r.Digest != "" {
		return r.Registry + "/" + r.Repository + "@" + r.Digest
	}
	return r.Registry + "/" + r.Repository + ":" + r.Tag
}

// IsReference reports whether a fork's source names a registry reference
// rather than a local tag: it has a repository path, which no tag can.
func IsReference(source string) bool { return strings.Contains(source, "/") }

// ParseReference parses and normalizes a reference a fork names. Unlike
// a pull's, its first component must be a registry host (a '.' or a
// port in it, or localhost): forkd has no default registry, and
// team/py:1 would otherwise reach a host called team.
func ParseReference(ref string) (Reference, error) {
	if err := CheckReference(ref); err != nil {
		return Reference{}, err
	}
	host, _, _ := strings.Cut(ref, "/")
	if !strings.ContainsAny(host, ".:[") && host != "localhost" {
		return Reference{}, fmt.Errorf("reference %q names no registry host (%q is not one: it has no '.' or port): write it as HOST[:PORT]/REPOSITORY:TAG, e.g. docker.io/%s; forkd has no default registry: %w",
			ref, host, ref, errdefs.ErrInvalidArgument)
	}
	r, _ := registry.ParseReference(ref)
	out := Reference{Registry: strings.ToLower(r.Registry), Repository: r.Repository}
	if d, err := r.Digest(); err == nil {
		out.Digest = d.String()
	} else {
		out.Tag = r.Reference
	}
	return out, nil
}

// CheckForkSource accepts what a fork may name: a local tag, or a
// registry reference (ParseReference). An invalid one gets the error of
// what it looks like.
func CheckForkSource(source string) error {
	if IsReference(source) {
		_, err := ParseReference(source)
		return err
	}
	return snapshot.ValidateTag(source)
}

// Resolve asks the registry for the digest of ref's manifest (a HEAD, no
// blob is fetched), for a pull that may be unneeded: the caller compares
// it with the digest of the copy it holds.
func Resolve(ctx context.Context, ref string, a Auth) (string, error) {
	repo, err := repository(ref, a)
	if err != nil {
		return "", err
	}
	desc, err := repo.Resolve(ctx, repo.Reference.Reference)
	if err != nil {
		return "", wrapRegistry(ctx, repo.Reference.Registry, "resolve "+ref, err)
	}
	return desc.Digest.String(), nil
}
