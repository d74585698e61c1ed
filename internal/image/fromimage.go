package image

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// Source records the OCI image a root file system was unpacked from
// (recipe from = "REF").
type Source struct {
	// Ref is the reference as the recipe gave it; Name its canonical form.
	Ref  string `json:"ref"`
	Name string `json:"name"`
	// Digest is the image manifest's, which the image's digest covers;
	// IndexDigest the manifest list's it was picked from, if any.
	Digest      string          `json:"digest"`
	IndexDigest string          `json:"index_digest,omitempty"`
	Platform    string          `json:"platform"`
	Layers      []string        `json:"layers"`
	Config      ociimage.Config `json:"config"`
}

// LayerCacheDir is where images built with from keep the layers they
// pulled, shared by all images (an ociimage.Cache); each image records its
// layers in its manifest (Image.From.Layers).
func LayerCacheDir(dataDir string) string {
	return filepath.Join(dataDir, "cache", "layers")
}

// puller is the registry client for recipe r; layers are cached in
// LayerCacheDir.
func (b *Builder) puller(r *recipe.Recipe) *ociimage.Puller {
	return &ociimage.Puller{
		CacheDir:   LayerCacheDir(b.DataDir),
		Insecure:   r.InsecureRegistry,
		Keychain:   b.Registry.Keychain,
		PublicOnly: b.Registry.PublicOnly,
		Limits:     b.PullLimits,
		Progress:   b.Progress,
	}
}

// ociTree unpacks img's layers into tree.
func (b *Builder) ociTree(ctx context.Context, img *ociimage.Image, tree string) (*Source, error) {
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, err
	}
	st, err := img.Unpack(ctx, tree)
	if err != nil {
		return nil, err
	}
	if st.SkippedDevices > 0 {
		progressFunc(b.Progress)("rootfs: skipped %d device nodes (the guest mounts devtmpfs on /dev)", st.SkippedDevices)
	}
	return &Source{Ref: img.Ref, Name: img.Name, Digest: img.Digest, IndexDigest: img.IndexDigest,
		Platform: img.Platform, Layers: img.Layers(), Config: img.Config}, nil
}

// writeImageConfig writes agentapi.ImageConfigPath into tree, after
// finishTree made /etc a real directory (an image's own /etc/forkd, if
// any, is replaced).
func writeImageConfig(tree string, c ociimage.Config) error {
	rel := strings.TrimPrefix(agentapi.ImageConfigPath, "/")
	dir := filepath.Join(tree, filepath.Dir(rel))
	if st, err := os.Lstat(dir); err == nil && !st.IsDir() {
		if err := os.Remove(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(agentapi.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User,
		Entrypoint: c.Entrypoint, Cmd: c.Cmd}, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(tree, rel)
	if err := os.RemoveAll(p); err != nil {
		return err
	}
	return os.WriteFile(p, append(data, '\n'), 0o644)
}
