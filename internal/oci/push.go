package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/forkd-dev/forkd/internal/pack"
)

// PushStats describes a push.
type PushStats struct {
	Digest string // the artifact's manifest digest
	// Uploaded and Present are the parts (pack.Part.ID) sent and those the
	// registry had already.
	Uploaded, Present []string
	UploadedBytes     int64
	Signed            bool
}

// Push reads an archive (pack.Pack's output, signed or not) from r and
// stores it under ref as a forkd snapshot artifact: each part is staged
// in tmpDir to learn its digest, and uploaded unless the registry has it.
// The tag is set last, so a failed push leaves ref as it was. progress,
// if set, is told about each part.
func Push(ctx context.Context, r io.Reader, ref, tmpDir string, a Auth, progress func(string)) (PushStats, error) {
	var stats PushStats
	if progress == nil {
		progress = func(string) {}
	}
	repo, err := repository(ref, a)
	if err != nil {
		return stats, err
	}
	pr, err := pack.ReadParts(r)
	if err != nil {
		return stats, err
	}
	defer pr.Close()
	stats.Signed = pr.Signature != nil
	var layers []ocispec.Descriptor
	for {
		desc, part, err := stagePart(ctx, pr, tmpDir, func(desc ocispec.Descriptor, part pack.Part, f *os.File) error {
			ok, err := repo.Exists(ctx, desc)
			if err != nil {
				return wrapRegistry(ctx, repo.Reference.Registry, "check blob "+desc.Digest.String()+" of "+ref, err)
			}
			if ok {
				stats.Present = append(stats.Present, part.ID())
				progress(fmt.Sprintf("%s: present (%s)", part.ID(), desc.Digest.Encoded()[:12]))
				return nil
			}
			progress(fmt.Sprintf("%s: uploading %d bytes", part.ID(), desc.Size))
			if err := repo.Push(ctx, desc, f); err != nil {
				return wrapRegistry(ctx, repo.Reference.Registry, "upload "+part.ID()+" (blob "+desc.Digest.String()+") to "+ref, err)
			}
			stats.Uploaded = append(stats.Uploaded, part.ID())
			stats.UploadedBytes += desc.Size
			return nil
		})
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return stats, err
		}
		desc.Annotations = map[string]string{AnnotationPart: part.ID()}
		layers = append(layers, desc)
	}
	cfg, err := json.Marshal(Config{Manifest: pr.Raw, Signature: pr.Signature})
	if err != nil {
		return stats, err
	}
	cfgDesc := ocispec.Descriptor{MediaType: ConfigMediaType, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))}
	if ok, err := repo.Exists(ctx, cfgDesc); err != nil || !ok {
		if err := repo.Push(ctx, cfgDesc, bytes.NewReader(cfg)); err != nil {
			return stats, wrapRegistry(ctx, repo.Reference.Registry, "upload the config of "+ref, err)
		}
	}
	head := pr.Manifest.Snapshots[len(pr.Manifest.Snapshots)-1].Manifest
	desc, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, ArtifactType, oras.PackManifestOptions{
		Layers: layers, ConfigDescriptor: &cfgDesc,
		ManifestAnnotations: map[string]string{
			ocispec.AnnotationCreated: pr.Manifest.Created.UTC().Format("2006-01-02T15:04:05Z07:00"),
			ocispec.AnnotationTitle:   head.Tag,
		},
	})
	if err != nil {
		return stats, wrapRegistry(ctx, repo.Reference.Registry, "upload the manifest of "+ref, err)
	}
	if err := repo.Tag(ctx, desc, repo.Reference.Reference); err != nil {
		return stats, wrapRegistry(ctx, repo.Reference.Registry, "tag "+ref, err)
	}
	stats.Digest = desc.Digest.String()
	return stats, nil
}

// stagePart writes the next part to a temporary file, computing its
// descriptor, and calls upload with the file rewound; io.EOF after the
// last part.
func stagePart(ctx context.Context, pr *pack.PartReader, tmpDir string, upload func(ocispec.Descriptor, pack.Part, *os.File) error) (ocispec.Descriptor, pack.Part, error) {
	f, err := os.CreateTemp(tmpDir, ".forkd-push-")
	if err != nil {
		return ocispec.Descriptor{}, pack.Part{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	part, err := pr.WriteNext(cw)
	if err != nil {
		return ocispec.Descriptor{}, part, err
	}
	if err := ctx.Err(); err != nil {
		return ocispec.Descriptor{}, part, err
	}
	desc := ocispec.Descriptor{MediaType: PartMediaType, Digest: digest.NewDigest(digest.SHA256, h), Size: cw.n}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return desc, part, err
	}
	return desc, part, upload(desc, part, f)
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
