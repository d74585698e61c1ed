package bench

// forkd bench image-from: `image build --from` of a test-made image
// against skopeo copy + extraction, and a rebuild (issue #18).

import (
	"archive/tar"
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/localregistry"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// ImageFromOptions are bench image-from's flags.
type ImageFromOptions struct {
	// SizeMB is the image's content, in Layers layers of Files files each.
	SizeMB, Layers, Files int
	// AgentBinary finds forkd-agent, which the image builder installs.
	AgentBinary func() (string, error)
}

// ImageFrom runs bench image-from: it pushes an image made here to
// Debian's docker-registry on loopback and measures forkd's `image build
// --from` of it (cold, again, with the layers cached) against skopeo copy
// followed by umoci unpack and by tar of each layer. Everything it made is
// removed at the end.
func ImageFrom(ctx context.Context, c Config, o ImageFromOptions) error {
	if o.SizeMB < 1 || o.Layers < 1 || o.Files < 1 {
		return fmt.Errorf("--size-mb, --layers and --files must be at least 1: %w", errdefs.ErrInvalidArgument)
	}
	for _, t := range []string{localregistry.Binary, "skopeo", "umoci", "tar"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s is not in PATH; `scripts/install-deps.sh --bench` installs docker-registry, skopeo and umoci: %w", t, errdefs.ErrFailedPrecondition)
		}
	}
	agent, err := o.AgentBinary()
	if err != nil {
		return err
	}
	say := newSay(c.Progress)
	reapStale(c.RunDir, c.DataDir, say)
	// In the data dir: skopeo and umoci write to the same file system as
	// forkd's builder.
	work := dataDirOf(c.DataDir, "image-from", os.Getpid())
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	regDir, err := os.MkdirTemp("", "forkd-bench-registry-") // short: a unix socket's path
	if err != nil {
		return err
	}
	defer os.RemoveAll(regDir)
	reg, err := localregistry.Start(regDir, localregistry.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()

	say("making a %d MB image of %d layers and pushing it to %s", o.SizeMB, o.Layers, reg.Host)
	img, err := randomImage(work, o)
	if err != nil {
		return err
	}
	ref := reg.Host + "/forkd-bench/image-from:" + fmt.Sprint(os.Getpid())
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}

	rep := &report{Bench: "image-from", Date: time.Now().UTC(), Machine: hostMachine()}
	rep.Setup = fmt.Sprintf("%d MB of random files in %d gzip layers, registry on loopback; load %s", o.SizeMB, o.Layers, loadAvg())
	rec, err := recipe.FromRef(ref, true)
	if err != nil {
		return err
	}
	b := &image.Builder{DataDir: c.DataDir, AgentBinary: agent}
	var built *image.Image
	defer func() { cleanBenchImage(c.DataDir, built, say) }()
	build := func(measure string) error {
		var ph phases
		b.Progress = ph.note
		start := time.Now()
		out, err := b.Build(ctx, rec)
		d := time.Since(start)
		if err != nil {
			return err
		}
		built = out
		rep.row(measure, fmt.Sprintf("%.2f s%s", d.Seconds(), ph.summary(start)), vals{"wall_s": d.Seconds()})
		say("%s: %.2f s", measure, d.Seconds())
		return nil
	}
	if err := build("forkd image build --from, cold (no layer cached)"); err != nil {
		return err
	}
	if err := build("forkd image build --from again (rebuild, nothing changed; target ≤ 2 s)"); err != nil {
		return err
	}
	dropBuiltKeepLayers(c.DataDir, built)
	if err := build("forkd image build --from, layers cached, no root file system"); err != nil {
		return err
	}

	oci := filepath.Join(work, "oci")
	start := time.Now()
	if err := runTool(ctx, "skopeo", "copy", "--quiet", "--src-tls-verify=false", "docker://"+ref, "oci:"+oci+":bench"); err != nil {
		return err
	}
	copyD := time.Since(start)
	rep.row("skopeo copy docker://… oci:DIR", fmt.Sprintf("%.2f s", copyD.Seconds()), vals{"wall_s": copyD.Seconds()})
	start = time.Now()
	if err := runTool(ctx, "umoci", "unpack", "--image", oci+":bench", filepath.Join(work, "bundle")); err != nil {
		return err
	}
	umociD := time.Since(start)
	rep.row("umoci unpack", fmt.Sprintf("%.2f s; with the copy %.2f s", umociD.Seconds(), (copyD+umociD).Seconds()),
		vals{"wall_s": umociD.Seconds(), "with_copy_s": (copyD + umociD).Seconds()})
	start = time.Now()
	if err := untarLayers(ctx, oci, filepath.Join(work, "tree")); err != nil {
		return err
	}
	tarD := time.Since(start)
	rep.row("tar -xzf of each layer", fmt.Sprintf("%.2f s; with the copy %.2f s", tarD.Seconds(), (copyD+tarD).Seconds()),
		vals{"wall_s": tarD.Seconds(), "with_copy_s": (copyD + tarD).Seconds()})
	return c.write(rep)
}

// randomImage writes o.Layers layers of random files into dir and stacks
// them into a linux image (gzip at the fastest level: the content does not
// compress anyway).
func randomImage(dir string, o ImageFromOptions) (v1.Image, error) {
	per := int64(o.SizeMB) << 20 / int64(o.Layers*o.Files)
	var seed [32]byte
	crand.Read(seed[:]) // a new image every run: nothing of it is cached
	rng := rand.NewChaCha8(seed)
	var layers []v1.Layer
	for i := range o.Layers {
		p := filepath.Join(dir, fmt.Sprintf("layer-%d.tar", i))
		if err := writeRandomTar(p, i, o.Files, per, rng); err != nil {
			return nil, err
		}
		l, err := tarball.LayerFromFile(p, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/bin:/bin"}
	return mutate.ConfigFile(img, cf)
}

func writeRandomTar(p string, layer, files int, size int64, rng *rand.ChaCha8) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	mod := time.Unix(1700000000, 0)
	d := fmt.Sprintf("data/layer%d/", layer)
	for _, h := range []*tar.Header{{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mod}, {Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mod}} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	buf := make([]byte, 1<<20)
	for j := range files {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%sfile%d.bin", d, j), Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mod}); err != nil {
			return err
		}
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			rng.Read(buf[:n])
			if _, err := tw.Write(buf[:n]); err != nil {
				return err
			}
			left -= n
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// phases splits a build's wall clock by its progress lines: until the
// reference is resolved (and the kernel found), until the last layer is
// downloaded, until the tree is unpacked, and the rest (mkfs.ext4,
// hashing, the image's files).
type phases struct {
	mu                          sync.Mutex
	resolved, fetched, unpacked time.Time
}

func (p *phases) note(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case strings.HasPrefix(line, "image: ") && strings.Contains(line, " is sha256:"):
		p.resolved = time.Now()
	case strings.HasPrefix(line, "pull: layer "):
		p.fetched = time.Now()
	case strings.HasPrefix(line, "pull: ") && strings.Contains(line, " unpacked,"):
		p.unpacked = time.Now()
	}
}

func (p *phases) summary(start time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unpacked.IsZero() || p.resolved.IsZero() {
		return ""
	}
	fetched := p.fetched
	if fetched.IsZero() { // every layer was cached
		fetched = p.resolved
	}
	return fmt.Sprintf(" (resolve %.2f s, download %.2f s, unpack %.2f s, mkfs.ext4 and image files %.2f s)",
		p.resolved.Sub(start).Seconds(), fetched.Sub(p.resolved).Seconds(), p.unpacked.Sub(fetched).Seconds(),
		time.Since(p.unpacked).Seconds())
}

// dropBuiltKeepLayers removes img and its cached root file system, so the
// next build unpacks the cached layers again.
func dropBuiltKeepLayers(dataDir string, img *image.Image) {
	image.Remove(dataDir, img.Digest)
	if img.RootfsKey != "" {
		os.RemoveAll(filepath.Join(dataDir, "cache", "rootfs", img.RootfsKey))
	}
}

// cleanBenchImage removes what the bench's builds left: the image, its
// root file system and its layers (no other image has them: their content
// is this run's).
func cleanBenchImage(dataDir string, img *image.Image, say sayFunc) {
	if img == nil {
		return
	}
	dropBuiltKeepLayers(dataDir, img)
	if img.From != nil {
		if _, err := (ociimage.Cache{Dir: image.LayerCacheDir(dataDir)}).Remove(img.From.Layers); err != nil {
			say("the bench's layers stay in the cache (%v); `forkd system prune` removes them", err)
		}
	}
}

// untarLayers extracts the layers of the OCI layout's only image into dir
// with tar, bottom first (whiteouts are left as files: none in this image).
func untarLayers(ctx context.Context, layout, dir string) error {
	var idx v1.IndexManifest
	var man v1.Manifest
	if err := readJSON(filepath.Join(layout, "index.json"), &idx); err != nil {
		return err
	}
	if len(idx.Manifests) != 1 {
		return fmt.Errorf("%s: %d manifests, want 1", layout, len(idx.Manifests))
	}
	if err := readJSON(blobPath(layout, idx.Manifests[0].Digest), &man); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, l := range man.Layers {
		if err := runTool(ctx, "tar", "-xzf", blobPath(layout, l.Digest), "-C", dir); err != nil {
			return err
		}
	}
	return nil
}

func blobPath(layout string, d v1.Hash) string {
	return filepath.Join(layout, "blobs", d.Algorithm, d.Hex)
}

func readJSON(p string, v any) error {
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

func runTool(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
