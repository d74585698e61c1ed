package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// Builder builds guest images from recipes. Its fields are read-only after
// construction; one Builder may run several Builds at once.
type Builder struct {
	// DataDir holds images/ and cache/ (see the package doc).
	DataDir string
	// AgentBinary is the static executable that becomes the guest's /init
	// (forkd-agent).
	AgentBinary string
	// Progress, if set, receives one-line status messages.
	Progress func(string)
	// Refresh asks apt for the newest kernel and rebuilds the root file
	// system even when cached, to pick up Debian updates. The result is a new
	// image when anything changed; existing images stay as they are.
	Refresh bool
	// PullLimits bound what an OCI image (recipe from) may unpack to;
	// zero fields: ociimage.DefaultLimits.
	PullLimits ociimage.Limits
	// Steps runs the Run steps of recipes that have them (steps.go); nil:
	// such recipes fail with NotImplemented.
	Steps StepRunner
	// Registry is how a build reaches the registry of its from image.
	Registry RegistryAccess
	// Tenant, for a tenant's build, scopes its build steps' cache: a
	// step's layer is reused only by builds of the same tenant ("" the
	// operator's).
	Tenant string
}

// RegistryAccess is how a build pulls its from image.
type RegistryAccess struct {
	// Keychain supplies credentials; nil: the daemon user's docker
	// config (an operator's build). StaticCredentials makes one from what
	// a request sent.
	Keychain authn.Keychain
	// PublicOnly refuses registries at addresses that are not public (a
	// tenant's build, unless the operator allowed the registry).
	PublicOnly bool
}

// StaticCredentials is a keychain that answers user and password (none:
// anonymous) for every registry, and never reads a docker config.
func StaticCredentials(user, password string) authn.Keychain {
	if user == "" && password == "" {
		return staticKeychain{authn.Anonymous}
	}
	return staticKeychain{authn.FromConfig(authn.AuthConfig{Username: user, Password: password})}
}

type staticKeychain struct{ a authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.a, nil }

// Build returns the image for r, building what is not cached. Building the
// same recipe with the same kernel, root file system and agent again returns
// the existing image.
func (b *Builder) Build(ctx context.Context, r *recipe.Recipe) (*Image, error) {
	img, err := b.build(ctx, r)
	if err != nil {
		name := "<nil>"
		if r != nil {
			name = r.Name
		}
		return nil, fmt.Errorf("build image %q: %w", name, err)
	}
	return img, nil
}

func (b *Builder) build(ctx context.Context, r *recipe.Recipe) (*Image, error) {
	started := time.Now()
	say := progressFunc(b.Progress)
	if r == nil {
		return nil, fmt.Errorf("no recipe: %w", errdefs.ErrInvalidArgument)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if b.DataDir == "" {
		return nil, fmt.Errorf("Builder.DataDir is empty: %w", errdefs.ErrInvalidArgument)
	}
	if b.AgentBinary == "" {
		return nil, fmt.Errorf("Builder.AgentBinary is empty (path of a static forkd-agent): %w", errdefs.ErrInvalidArgument)
	}
	if _, err := checkAgent(b.AgentBinary); err != nil {
		return nil, err
	}
	if err := requireTools("mkfs.ext4"); err != nil {
		return nil, err
	}
	release, err := hostRelease()
	if err != nil {
		return nil, err
	}

	cache := filepath.Join(b.DataDir, "cache")
	fetch := FetchKernel
	if b.Refresh {
		fetch = RefreshKernel
	}
	kernel, err := fetch(ctx, cache, b.Progress)
	if err != nil {
		return nil, err
	}
	var from *ociimage.Image
	if r.From != "" {
		// Resolved on every build, like a pull: a tag that moved is a new
		// image, the same digest finds the cached root file system.
		if from, err = b.puller(r).Resolve(ctx, r.From); err != nil {
			return nil, err
		}
		say("image: %s is %s", r.From, from.Digest)
	}
	var chain *stepChain
	if len(r.Steps) > 0 {
		// Held until the image lists the steps' layers: a prune must not
		// take one in between.
		unhold, err := (ociimage.Cache{Dir: LayerCacheDir(b.DataDir)}).Hold(ctx)
		if err != nil {
			return nil, err
		}
		defer unhold()
		if chain, err = b.runSteps(ctx, r, from, kernel, release, started); err != nil {
			return nil, err
		}
	}
	rfs, err := b.rootfs(ctx, r, from, release, started, chain)
	if err != nil {
		return nil, err
	}
	agent, err := fileDigest(b.AgentBinary)
	if err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	}
	digest := imageDigest(r, kernel, rfs, agent)

	dir := filepath.Join(imagesDir(b.DataDir), digest)
	if img, err := loadImage(dir); err == nil {
		say("image: %s %s is cached (%s)", r.Name, digest[:12], time.Since(started).Round(time.Millisecond))
		return img, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(imagesDir(b.DataDir), ".locks", digest+".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if img, err := loadImage(dir); err == nil {
		return img, nil // a concurrent build of the same inputs finished first
	}
	if err := b.assemble(dir, digest, r, kernel, rfs, agent); err != nil {
		return nil, err
	}
	img, err := loadImage(dir)
	if err != nil {
		return nil, err
	}
	say("image: %s %s built in %s", r.Name, digest[:12], time.Since(started).Round(time.Millisecond))
	return img, nil
}

// imageDigest names an image by everything that shapes it.
func imageDigest(r *recipe.Recipe, k *Kernel, rfs *cachedRootfs, agent FileInfo) string {
	in := struct {
		Format        int    `json:"format"`
		Recipe        string `json:"recipe"`
		Kernel        string `json:"kernel"`
		KernelVersion string `json:"kernel_version"`
		Rootfs        string `json:"rootfs"`
		RootfsSHA256  string `json:"rootfs_sha256"`
		Agent         string `json:"agent"`
		From          string `json:"from,omitempty"`
	}{formatVersion, r.Digest(), k.Package, k.PackageVersion, rfs.Info.Key, rfs.Info.File.SHA256, agent.SHA256, ""}
	if rfs.Info.From != nil {
		in.From = rfs.Info.From.Digest // also in the rootfs key; named for the record
	}
	data, _ := json.Marshal(in)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// assemble writes the image in a staging directory and publishes it as dir.
func (b *Builder) assemble(dir, digest string, r *recipe.Recipe, k *Kernel, rfs *cachedRootfs, agent FileInfo) (err error) {
	stage, err := newStaging(imagesDir(b.DataDir))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			removeTree(stage)
		}
	}()
	files := map[string]FileInfo{}

	if err := linkOrCopy(k.Vmlinuz, filepath.Join(stage, kernelName)); err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	st, err := os.Stat(k.Vmlinuz)
	if err != nil {
		return err
	}
	files[kernelName] = FileInfo{Size: st.Size(), SHA256: k.VmlinuzSHA256}

	info, _ := json.MarshalIndent(map[string]string{
		"digest":         digest,
		"recipe":         r.Name,
		"kernel_version": k.Version,
		"agent_sha256":   agent.SHA256,
	}, "", "  ")
	initrd := filepath.Join(stage, initrdName)
	if err := writeInitramfs(initrd, b.AgentBinary, k, append(info, '\n')); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if files[initrdName], err = fileDigest(initrd); err != nil {
		return err
	}

	if err := linkOrCopy(rfs.Path, filepath.Join(stage, rootfsName)); err != nil {
		return fmt.Errorf("root file system: %w", err)
	}
	files[rootfsName] = rfs.Info.File

	var m manifest
	m.FormatVersion = formatVersion
	m.Digest = digest
	m.Recipe.Name, m.Recipe.Digest, m.Recipe.Description = r.Name, r.Digest(), r.Description
	m.Base, m.Packages, m.From, m.Steps = r.Base, r.Packages, rfs.Info.From, rfs.Info.Steps
	if m.Packages == nil {
		m.Packages = []string{}
	}
	m.Kernel.Version, m.Kernel.Package, m.Kernel.PackageVersion = k.Version, k.Package, k.PackageVersion
	m.Rootfs.Key, m.Rootfs.Release, m.Rootfs.SHA256 = rfs.Info.Key, rfs.Info.Release, rfs.Info.File.SHA256
	m.AgentSHA256 = agent.SHA256
	m.MemoryMiB, m.VCPUs = r.MemoryMiB, r.VCPUs
	m.Python.Enabled, m.Python.Warm = r.Python.Enabled, r.Python.Warm
	m.Files = files
	m.Created = time.Now().UTC()
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	// Written last: a directory with a manifest is a complete image.
	if err := writeFileSync(filepath.Join(stage, manifestName), append(data, '\n'), 0o444); err != nil {
		return err
	}
	if _, err := os.Lstat(dir); err == nil {
		// Not a loadable image (we checked under the lock): debris of a
		// manual edit. Move it out of the way rather than fail forever.
		junk := filepath.Join(imagesDir(b.DataDir), fmt.Sprintf("%s%d-bad-%s", stagingPrefix, os.Getpid(), digest[:12]))
		if err := os.Rename(dir, junk); err != nil {
			return err
		}
		defer removeTree(junk)
	}
	return publish(stage, dir)
}
