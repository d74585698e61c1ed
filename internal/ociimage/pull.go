package ociimage

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netguard"
)

// Puller resolves image references and fetches their layers into a cache.
// Its fields are read-only after construction; one Puller may serve several
// pulls at once.
type Puller struct {
	// CacheDir holds the layer blobs (see the package doc).
	CacheDir string
	// Insecure allows plain HTTP and registries whose TLS certificate is
	// not trusted. Off, both are refused, loopback included.
	Insecure bool
	// Keychain supplies credentials; nil: authn.DefaultKeychain (the
	// docker config and its credential helpers).
	Keychain authn.Keychain
	// Limits bound what an image may unpack to; zero fields: DefaultLimits.
	Limits Limits
	// Progress, if set, receives one-line status messages.
	Progress func(string)
	// PublicOnly refuses connections to addresses that are not public
	// (netguard), checked at dial time, and ignores proxies from the
	// environment: a tenant's build must not make the daemon reach the
	// host's or its network's services.
	PublicOnly bool
	// Transport, if set, replaces the HTTP transport (tests).
	Transport http.RoundTripper
}

// Config is what a guest keeps of an image's configuration.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Image is a resolved image: its manifest and config are read, its layers
// not yet fetched.
type Image struct {
	// Ref is the reference as given; Name its canonical form.
	Ref, Name string
	// Digest is the image manifest's ("sha256:..."); IndexDigest the
	// manifest list's it was picked from, if any.
	Digest, IndexDigest string
	Platform            string // os/arch
	Config              Config

	layers []layer
	p      *Puller
}

type layer struct {
	desc   v1.Descriptor
	diffID v1.Hash
	l      v1.Layer
}

// maxLayers bounds the layers of one image (Docker's overlay driver
// stops at 128): each is a download and a pass over the tree.
const maxLayers = 256

// wantPlatform is the guest's: forkd boots the host's architecture.
var wantPlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// Resolve reads ref's manifest (picking the guest's platform from a
// manifest list) and its config.
func (p *Puller) Resolve(ctx context.Context, ref string) (*Image, error) {
	img, err := p.resolve(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", ref, err)
	}
	return img, nil
}

func (p *Puller) resolve(ctx context.Context, ref string) (*Image, error) {
	var nopts []name.Option
	if p.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("not an image reference (%v); write REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST]: %w", err, errdefs.ErrInvalidArgument)
	}
	guard := &schemeGuard{insecure: p.Insecure, base: p.transport()}
	kc := p.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(guard), remote.WithAuthFromKeychain(kc)}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, p.registryError(r, guard, err)
	}
	out := &Image{Ref: ref, Name: r.Name(), p: p}
	var v1img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		out.IndexDigest = desc.Digest.String()
		if v1img, err = pickPlatform(desc); err != nil {
			return nil, err
		}
	case desc.MediaType.IsImage():
		if v1img, err = desc.Image(); err != nil {
			return nil, p.registryError(r, guard, err)
		}
	default:
		return nil, fmt.Errorf("%s is a %s, not an image or a manifest list: %w", r.Name(), desc.MediaType, errdefs.ErrInvalidArgument)
	}
	if err := out.read(v1img); err != nil {
		return nil, p.registryError(r, guard, err)
	}
	return out, nil
}

// read fills in the image manifest's digest, the config and the layers.
func (img *Image) read(v v1.Image) error {
	d, err := v.Digest()
	if err != nil {
		return err
	}
	img.Digest = d.String()
	cf, err := v.ConfigFile()
	if err != nil {
		return err
	}
	if (cf.OS != "" && cf.OS != wantPlatform.OS) || (cf.Architecture != "" && cf.Architecture != wantPlatform.Architecture) {
		return fmt.Errorf("image is for %s/%s, forkd's guests run %s/%s: %w",
			cf.OS, cf.Architecture, wantPlatform.OS, wantPlatform.Architecture, errdefs.ErrInvalidArgument)
	}
	img.Platform = wantPlatform.OS + "/" + wantPlatform.Architecture
	img.Config = Config{Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd}
	m, err := v.Manifest()
	if err != nil {
		return err
	}
	ls, err := v.Layers()
	if err != nil {
		return err
	}
	if len(m.Layers) > maxLayers {
		return fmt.Errorf("image has %d layers, more than the limit of %d (squash it): %w", len(m.Layers), maxLayers, errdefs.ErrResourceExhausted)
	}
	if len(ls) != len(m.Layers) || len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return fmt.Errorf("manifest lists %d layers, config %d diff IDs: %w", len(m.Layers), len(cf.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	lim := img.p.Limits.withDefaults()
	for i, l := range ls {
		if m.Layers[i].Size < 0 || m.Layers[i].Size > lim.MaxBytes {
			return fmt.Errorf("layer %s declares %d bytes, above the limit of %d (Limits.MaxBytes): %w",
				m.Layers[i].Digest, m.Layers[i].Size, lim.MaxBytes, errdefs.ErrResourceExhausted)
		}
		img.layers = append(img.layers, layer{desc: m.Layers[i], diffID: cf.RootFS.DiffIDs[i], l: l})
	}
	return nil
}

// pickPlatform returns the guest platform's image of a manifest list.
func pickPlatform(desc *remote.Descriptor) (v1.Image, error) {
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var offered []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			continue
		}
		if m.Platform.OS == wantPlatform.OS && m.Platform.Architecture == wantPlatform.Architecture && m.MediaType.IsImage() {
			return idx.Image(m.Digest)
		}
		offered = append(offered, m.Platform.String())
	}
	if len(offered) == 0 {
		offered = []string{"none declared"}
	}
	return nil, fmt.Errorf("the manifest list has no %s/%s image (it offers: %s): %w",
		wantPlatform.OS, wantPlatform.Architecture, strings.Join(offered, ", "), errdefs.ErrNotFound)
}

// Layers returns the digests of the image's layers, bottom first.
func (img *Image) Layers() []string {
	out := make([]string, len(img.layers))
	for i, l := range img.layers {
		out[i] = l.desc.Digest.String()
	}
	return out
}

func (p *Puller) transport() http.RoundTripper {
	if p.Transport != nil {
		return p.Transport
	}
	t := remote.DefaultTransport.(*http.Transport).Clone()
	if p.PublicOnly {
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: netguard.PublicOnly}
		t.DialContext, t.Proxy = d.DialContext, nil
	}
	if p.Insecure {
		t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for with --insecure-registry
	}
	return t
}

// schemeGuard refuses plain-HTTP requests unless the pull is insecure:
// go-containerregistry falls back to HTTP for loopback and private
// addresses on its own.
type schemeGuard struct {
	insecure bool
	base     http.RoundTripper
	refused  atomic.Bool
}

var errPlainHTTP = errors.New("plain HTTP refused")

func (g *schemeGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.insecure {
		g.refused.Store(true)
		return nil, errPlainHTTP
	}
	return g.base.RoundTrip(req)
}

// registryError classifies a failed registry call.
func (p *Puller) registryError(r name.Reference, g *schemeGuard, err error) error {
	if errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || errdefs.IsResourceExhausted(err) {
		return err
	}
	if g.refused.Load() {
		return fmt.Errorf("registry %s did not answer over trusted HTTPS (%v); if it is a plain-HTTP or self-signed registry you trust, pass --insecure-registry (recipe: insecure_registry = true): %w",
			r.Context().RegistryStr(), err, errdefs.ErrFailedPrecondition)
	}
	var private *netguard.PrivateAddrError
	if errors.As(err, &private) {
		return fmt.Errorf("registry %s: %w", r.Context().RegistryStr(), private)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("registry %s refused the credentials (%v); log in with `docker login %s` or check ~/.docker/config.json: %w",
				r.Context().RegistryStr(), err, r.Context().RegistryStr(), errdefs.ErrPermissionDenied)
		case http.StatusNotFound:
			return fmt.Errorf("%s not found in the registry (%v): %w", r.Name(), err, errdefs.ErrNotFound)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return fmt.Errorf("%s not found in the registry (%v): %w", r.Name(), err, errdefs.ErrNotFound)
			}
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("registry %s: %v: %w", r.Context().RegistryStr(), err, errdefs.ErrUnavailable)
}
