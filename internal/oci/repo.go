// Package oci moves snapshots through OCI registries: Push stores a
// portable archive (internal/pack) as an OCI artifact whose config is the
// archive's signed manifest and whose layers are its parts (each image
// and each snapshot of a chain, one blob each); Pull fetches the artifact
// and only the parts this host lacks, rebuilds the others from its own
// files and hands the joined stream to pack.Unpack, which verifies every
// byte, the signature policy and the chain, and publishes atomically.
package oci

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"

	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Media types of a forkd snapshot artifact.
const (
	// ArtifactType marks a manifest as a forkd snapshot.
	ArtifactType = "application/vnd.forkd.snapshot.v1"
	// ConfigMediaType is the config blob: the archive's manifest and
	// signature (Config).
	ConfigMediaType = "application/vnd.forkd.snapshot.config.v1+json"
	// PartMediaType is one part of the archive (pack.Part): a zstd frame
	// of tar entries.
	PartMediaType = "application/vnd.forkd.snapshot.part.v1.tar+zstd"
	// AnnotationPart names a layer's part (pack.Part.ID).
	AnnotationPart = "dev.forkd.part"
)

// Config is the artifact's config blob.
type Config struct {
	// Manifest is forkd-archive.json's bytes, exactly as signed.
	Manifest []byte `json:"manifest"`
	// Signature is forkd-archive.sig's bytes; absent if unsigned.
	Signature []byte `json:"signature,omitempty"`
}

// Auth is how a registry is reached.
type Auth struct {
	// Username and Password (or an identity token in Password with an
	// empty Username... see auth.Credential) override the docker config.
	Username, Password string
	// PlainHTTP allows plain HTTP to a registry that is not on loopback
	// (one on loopback is always reached over plain HTTP).
	PlainHTTP bool
	// Client, if set, is the HTTP client (tests).
	Client *http.Client
}

// repository opens the repository of ref ("host[:port]/name:tag" or
// "...@sha256:..."), with credentials from a, else from the docker config
// (DOCKER_CONFIG or ~/.docker/config.json, credential helpers included).
func repository(ref string, a Auth) (*remote.Repository, error) {
	r, err := registry.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %v (want host[:port]/repository:tag): %w", ref, err, errdefs.ErrInvalidArgument)
	}
	if r.Reference == "" {
		return nil, fmt.Errorf("reference %q names no tag or digest: %w", ref, errdefs.ErrInvalidArgument)
	}
	repo, err := remote.NewRepository(ref)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	repo.PlainHTTP = a.PlainHTTP || isLoopback(r.Registry)
	client := &auth.Client{Client: a.Client, Cache: auth.NewCache(), Header: http.Header{"User-Agent": {"forkd"}}}
	if client.Client == nil {
		client.Client = http.DefaultClient
	}
	if a.Username != "" || a.Password != "" {
		cred := auth.Credential{Username: a.Username, Password: a.Password}
		if a.Username == "" {
			cred = auth.Credential{RefreshToken: a.Password}
		}
		client.Credential = auth.StaticCredential(r.Registry, cred)
	} else if store, err := credentials.NewStoreFromDocker(credentials.StoreOptions{}); err == nil {
		client.Credential = credentials.Credential(store)
	}
	repo.Client = client
	return repo, nil
}

// isLoopback reports whether host (with an optional port) is a loopback
// name or address.
func isLoopback(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// wrapRegistry classifies an error from the registry.
func wrapRegistry(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "401") || strings.Contains(msg, "403"):
		return fmt.Errorf("%s: %v (log in with `docker login`, or check the credentials): %w", what, err, errdefs.ErrPermissionDenied)
	case strings.Contains(msg, "not found") || strings.Contains(msg, "404"):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrNotFound)
	case strings.Contains(msg, "http: server gave HTTP response to HTTPS client"):
		return fmt.Errorf("%s: %v (a plain-HTTP registry: pass --plain-http if you trust the network): %w", what, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrUnavailable)
}

// DockerCredential looks up ref's registry in the docker config of this
// user (what `docker login` stored, credential helpers included): what
// the CLI sends along with a pull, so that the daemon fetches with the
// user's credentials. Empty if none are stored.
func DockerCredential(ctx context.Context, ref string) (username, password string, err error) {
	r, err := registry.ParseReference(ref)
	if err != nil {
		return "", "", fmt.Errorf("reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	store, err := credentials.NewStoreFromDocker(credentials.StoreOptions{})
	if err != nil {
		return "", "", fmt.Errorf("docker config: %w", err)
	}
	cred, err := store.Get(ctx, r.Registry)
	if err != nil {
		return "", "", fmt.Errorf("docker credentials for %s: %w", r.Registry, err)
	}
	if cred.Username == "" && cred.RefreshToken != "" {
		return "", cred.RefreshToken, nil
	}
	return cred.Username, cred.Password, nil
}
