package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// Bounds of what Pull reads before Unpack takes over.
const (
	maxManifestBytes = 4 << 20
	maxConfigBytes   = 24 << 20 // pack's manifest (16 MiB at most), base64, and a signature
	maxLayers        = 128
)

// PullOptions tunes Pull.
type PullOptions struct {
	// Unpack is handed to pack.Unpack (Tag, Force, VerifyKey,
	// TrustedKeys, limits); its signature policy is also checked before
	// any part is fetched.
	Unpack pack.UnpackOptions
	Auth   Auth
	// Check, if set, says whether this host can restore a snapshot of the
	// artifact (its VMM kind and version); it runs before any part is
	// fetched.
	Check func(*snapshot.Manifest) error
	// Progress, if set, is told about each part.
	Progress func(string)
}

// PullStats describes a pull.
type PullStats struct {
	Digest string // the artifact's manifest digest
	// Fetched are the parts (pack.Part.ID) fetched from the registry,
	// Local those this host had, rebuilt from its own files.
	Fetched, Local []string
	FetchedBytes   int64
	Unpack         pack.UnpackStats
}

// Pull fetches the snapshot artifact ref into dataDir and publishes its
// snapshot (and the ancestors of a layer) as pack.Unpack does: nothing
// is visible until every byte was verified, and a failed or interrupted
// pull leaves nothing behind. Parts this host already has (the same image,
// the same ancestor under its tag) are not fetched.
func Pull(ctx context.Context, dataDir, ref string, opts PullOptions) (*snapshot.Snapshot, PullStats, error) {
	var stats PullStats
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	repo, err := repository(ref, opts.Auth)
	if err != nil {
		return nil, stats, err
	}
	desc, rc, err := repo.FetchReference(ctx, repo.Reference.Reference)
	if pinned, derr := repo.Reference.Digest(); err != nil && derr == nil && strings.Contains(err.Error(), "digest mismatch") {
		// oras-go has no typed error for an answer that is not the
		// manifest the digest names.
		return nil, stats, fmt.Errorf("%s: the registry answered another manifest than %s (%v): refused (a registry or proxy on the way altered it): %w",
			ref, pinned, err, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, stats, wrapRegistry(ctx, repo.Reference.Registry, "fetch "+ref, err)
	}
	raw, err := readBounded(rc, desc, maxManifestBytes, "manifest of "+ref)
	rc.Close()
	if err != nil {
		return nil, stats, err
	}
	stats.Digest = desc.Digest.String()
	// A reference that pins a digest gets that manifest or nothing
	// (readBounded checked the bytes against desc's digest).
	if pinned, err := repo.Reference.Digest(); err == nil && desc.Digest != pinned {
		return nil, stats, fmt.Errorf("%s: the registry answered manifest %s for digest %s: refused (a registry or proxy on the way altered it): %w",
			ref, desc.Digest, pinned, errdefs.ErrInvalidArgument)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(raw, &man); err != nil || man.MediaType != ocispec.MediaTypeImageManifest {
		return nil, stats, fmt.Errorf("%s is not an OCI image manifest (media type %q): %w", ref, man.MediaType, errdefs.ErrInvalidArgument)
	}
	if man.ArtifactType != ArtifactType || man.Config.MediaType != ConfigMediaType {
		return nil, stats, fmt.Errorf("%s is not a forkd snapshot (artifact type %q, config %q; push one with `forkd push`): %w",
			ref, man.ArtifactType, man.Config.MediaType, errdefs.ErrInvalidArgument)
	}
	crc, err := repo.Fetch(ctx, man.Config)
	if err != nil {
		return nil, stats, wrapRegistry(ctx, repo.Reference.Registry, "fetch the config of "+ref, err)
	}
	cfgRaw, err := readBounded(crc, man.Config, maxConfigBytes, "config of "+ref)
	crc.Close()
	if err != nil {
		return nil, stats, err
	}
	var cfg Config
	if err := json.Unmarshal(cfgRaw, &cfg); err != nil {
		return nil, stats, fmt.Errorf("config of %s: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	// The signature policy first: with a key, nothing unsigned is read.
	m, err := pack.ParseVerified(cfg.Manifest, cfg.Signature, opts.Unpack)
	if err != nil {
		return nil, stats, fmt.Errorf("%s: %w", ref, err)
	}
	if opts.Check != nil {
		for i := range m.Snapshots {
			if err := opts.Check(&m.Snapshots[i].Manifest); err != nil {
				return nil, stats, fmt.Errorf("%s cannot run on this host: %w", ref, err)
			}
		}
	}
	parts, err := m.Parts()
	if err != nil {
		return nil, stats, err
	}
	if len(man.Layers) != len(parts) || len(man.Layers) > maxLayers {
		return nil, stats, fmt.Errorf("%s has %d layers, its archive manifest %d parts: %w", ref, len(man.Layers), len(parts), errdefs.ErrInvalidArgument)
	}
	var readers []io.Reader
	var fetches []*fetchReader
	defer func() {
		for _, f := range fetches {
			f.close()
		}
	}()
	for i, p := range parts {
		l := man.Layers[i]
		if l.MediaType != PartMediaType || l.Annotations[AnnotationPart] != p.ID() || l.Size <= 0 {
			return nil, stats, fmt.Errorf("%s: layer %d is %q (%s), want part %s: %w", ref, i, l.Annotations[AnnotationPart], l.MediaType, p.ID(), errdefs.ErrInvalidArgument)
		}
		if pack.HavePart(dataDir, m, p) {
			stats.Local = append(stats.Local, p.ID())
			progress(fmt.Sprintf("%s: here already", p.ID()))
			lp := pack.LocalPart(dataDir, m, p)
			defer lp.Close()
			readers = append(readers, lp)
			continue
		}
		stats.Fetched = append(stats.Fetched, p.ID())
		stats.FetchedBytes += l.Size
		fr := &fetchReader{desc: l, part: p.ID(), ref: ref}
		fr.open = func() (io.ReadCloser, error) {
			progress(fmt.Sprintf("%s: fetching %d bytes", p.ID(), l.Size))
			rc, err := repo.Fetch(ctx, l)
			if err != nil {
				return nil, wrapRegistry(ctx, repo.Reference.Registry, fr.what(), err)
			}
			return rc, nil
		}
		fetches = append(fetches, fr)
		readers = append(readers, fr)
	}
	stream, err := pack.Assemble(cfg.Manifest, cfg.Signature, readers)
	if err != nil {
		return nil, stats, err
	}
	snap, ust, err := pack.Unpack(ctx, dataDir, stream, opts.Unpack)
	stats.Unpack = ust
	if err != nil {
		// A fetch that failed is the cause, whatever Unpack made of the
		// stream it cut short ("archive is truncated"): the registry's
		// fault, not the archive's.
		if ctx.Err() != nil {
			return nil, stats, fmt.Errorf("pull %s: %w", ref, context.Cause(ctx))
		}
		for _, f := range fetches {
			if f.err != nil {
				return nil, stats, f.err
			}
		}
		return nil, stats, fmt.Errorf("%s: %w", ref, err)
	}
	return snap, stats, nil
}

// readBounded reads a descriptor's content, at most limit bytes, and
// checks its digest.
func readBounded(rc io.Reader, desc ocispec.Descriptor, limit int64, what string) ([]byte, error) {
	if desc.Size > limit {
		return nil, fmt.Errorf("%s is %d bytes, at most %d: %w", what, desc.Size, limit, errdefs.ErrInvalidArgument)
	}
	b, err := content.ReadAll(rc, desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %v (corrupt or altered in the registry?): %w", what, err, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// fetchReader fetches a part only when Unpack reaches it, and checks its
// size and digest as it goes: bytes past the size, or a digest mismatch
// at the end, are an error before Unpack sees the end of the part. Its
// first error stays in err, for Pull to report as the cause.
type fetchReader struct {
	desc ocispec.Descriptor
	part string
	ref  string
	open func() (io.ReadCloser, error)
	rc   io.ReadCloser
	vr   *content.VerifyReader
	n    int64 // bytes read so far
	err  error
}

// what names the part, its blob and the artifact, for errors.
func (f *fetchReader) what() string {
	return fmt.Sprintf("fetch %s (blob %s) of %s", f.part, f.desc.Digest, f.ref)
}

func (f *fetchReader) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if f.vr == nil {
		rc, err := f.open()
		if err != nil {
			f.err = err
			return 0, err
		}
		f.rc, f.vr = rc, content.NewVerifyReader(rc, f.desc)
	}
	n, err := f.vr.Read(p)
	f.n += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		if verr := f.vr.Verify(); verr != nil {
			f.err = fmt.Errorf("%s: the blob does not match its digest or size (%v): corrupt or altered in the registry: %w",
				f.what(), verr, errdefs.ErrInvalidArgument)
			return n, f.err
		}
		return n, io.EOF
	case err != nil:
		// The connection ended early (io.ErrUnexpectedEOF) or failed.
		f.err = fmt.Errorf("%s: the transfer broke off after %d of %d bytes (%v); try again: %w",
			f.what(), f.n, f.desc.Size, err, errdefs.ErrUnavailable)
	}
	return n, f.err
}

func (f *fetchReader) close() {
	if f.rc != nil {
		f.rc.Close()
	}
}
