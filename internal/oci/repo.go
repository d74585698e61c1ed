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
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netguard"
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
	// (one on loopback is reached over plain HTTP unless PublicOnly).
	PlainHTTP bool
	// NoDockerConfig uses Username and Password alone, never the docker
	// config of the process: the daemon pulls for tenants, who must not
	// borrow the operator's logins.
	NoDockerConfig bool
	// PublicOnly refuses connections to loopback, private, link-local and
	// shared addresses, at dial time (redirects and DNS answers
	// included): a tenant's pull must not make the daemon probe the
	// host's or its network's services.
	PublicOnly bool
	// Client, if set, is the HTTP client (tests).
	Client *http.Client
}

// CheckReference checks that ref names an artifact: host[:port]/repository
// with a tag or a digest.
func CheckReference(ref string) error {
	if ref == "" {
		return fmt.Errorf("no reference: give the artifact as host[:port]/repository:tag: %w", errdefs.ErrInvalidArgument)
	}
	r, err := registry.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("reference %q: %v (want host[:port]/repository:tag): %w", ref, err, errdefs.ErrInvalidArgument)
	}
	if r.Reference == "" {
		return fmt.Errorf("reference %q names no tag or digest (want host[:port]/repository:tag): %w", ref, errdefs.ErrInvalidArgument)
	}
	return nil
}

// RegistryHost is the registry part of ref (HOST or HOST:PORT), or ""
// for a reference that does not parse.
func RegistryHost(ref string) string {
	r, err := registry.ParseReference(ref)
	if err != nil {
		return ""
	}
	return r.Registry
}

// repository opens the repository of ref ("host[:port]/name:tag" or
// "...@sha256:..."), with credentials from a, else from the docker config
// (DOCKER_CONFIG or ~/.docker/config.json, credential helpers included).
func repository(ref string, a Auth) (*remote.Repository, error) {
	if err := CheckReference(ref); err != nil {
		return nil, err
	}
	r, _ := registry.ParseReference(ref)
	repo, err := remote.NewRepository(ref)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	repo.PlainHTTP = a.PlainHTTP || (isLoopback(r.Registry) && !a.PublicOnly)
	client := &auth.Client{Client: a.Client, Cache: auth.NewCache(), Header: http.Header{"User-Agent": {"forkd"}}}
	if client.Client == nil {
		client.Client = httpClient(a.PublicOnly)
	}
	if a.Username != "" || a.Password != "" {
		cred := auth.Credential{Username: a.Username, Password: a.Password}
		if a.Username == "" {
			cred = auth.Credential{RefreshToken: a.Password}
		}
		client.Credential = auth.StaticCredential(r.Registry, cred)
	} else if a.NoDockerConfig {
		// Anonymous: only what the caller sent.
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

// wrapRegistry classifies an error from the registry at host: what says
// what was being done, naming the reference or blob. Classes come from
// oras-go's typed errors (an HTTP error response, errdef.ErrNotFound)
// and net's, not from the message text.
func wrapRegistry(ctx context.Context, host, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
	var resp *errcode.ErrorResponse
	var opErr *net.OpError
	var private *netguard.PrivateAddrError
	switch {
	case errors.As(err, &private):
		return fmt.Errorf("%s: registry %s: %w", what, host, private)
	case errors.As(err, &resp) && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden):
		return fmt.Errorf("%s: registry %s refused access (HTTP %d: %v): log in with `docker login %s`, or check the credentials and the repository's permissions: %w",
			what, host, resp.StatusCode, registryMessage(resp), host, errdefs.ErrPermissionDenied)
	case errors.Is(err, errdef.ErrNotFound) || errors.As(err, &resp) && resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s: not found in registry %s (check the repository and tag; `forkd push` creates them): %w", what, host, errdefs.ErrNotFound)
	case errors.As(err, &resp):
		return fmt.Errorf("%s: registry %s answered HTTP %d: %v: %w", what, host, resp.StatusCode, registryMessage(resp), errdefs.ErrUnavailable)
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"): // net/http has no typed error for it
		return fmt.Errorf("%s: registry %s speaks plain HTTP: pass --plain-http if you trust the network to it: %w", what, host, errdefs.ErrUnavailable)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Errorf("%s: registry %s unreachable (%v): is it running, and is the address right? %w", what, host, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: registry %s: %v: %w", what, host, err, errdefs.ErrUnavailable)
}

// registryMessage is the registry's own words for an error response
// (its error codes and messages), or the HTTP status text.
func registryMessage(resp *errcode.ErrorResponse) string {
	if len(resp.Errors) > 0 {
		return resp.Errors.Error()
	}
	return http.StatusText(resp.StatusCode)
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
