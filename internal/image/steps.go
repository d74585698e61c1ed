package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Build steps (recipe run, files, env, workdir, user; a Dockerfile) run on
// top of the recipe's from image. Each step that changes files makes a
// layer: a Copy step on the host from the build context, a Run step in a
// build VM booted from the image of the steps before it (StepRunner), whose
// changes come back as a tar. Layers live in the OCI layer cache next to
// pulled ones; the image records them (Image.Steps) so a prune keeps them.
//
// Each step has a key: the hash of the key before it (the first one's
// covers the from image's digest), the step itself and its inputs (a Copy
// step's file contents). DataDir/cache/steps/<key>.json records the layer
// a key produced, so a step whose inputs did not change is not run again;
// a rebuild with no changed step reads only these records and finds the
// cached root file system.

// StepRunner runs build steps in VMs; the engine implements it
// (internal/sandbox).
type StepRunner interface {
	// RunStep boots spec.Image, runs spec.Step's command as spec says,
	// and writes what it changed in the root file system to changes (an
	// uncompressed OCI layer tar, at most spec.MaxLayerBytes). A command
	// that fails is an InvalidArgument error with the end of its output.
	RunStep(ctx context.Context, spec StepSpec, changes *ociimage.LayerWriter) error
}

// StepSpec is one Run step for a StepRunner.
type StepSpec struct {
	Image     vmm.Image
	MemoryMiB int
	VCPUs     int
	Step      recipe.Step
	// Env, Workdir and User are the configuration the steps before set
	// (on top of the from image's); Env includes the step's BuildEnv.
	Env     map[string]string
	Workdir string
	User    string
	// MaxLayerBytes bounds the changes read back.
	MaxLayerBytes int64
	// Output, if set, receives the command's output a line at a time
	// (the build's progress).
	Output func(string)
}

// StepRecord is one step of an image, in its manifest.
type StepRecord struct {
	Origin string `json:"origin"`
	Key    string `json:"key"`
	// Layer is the digest of the layer the step made; "" for Env,
	// Workdir and User.
	Layer string `json:"layer,omitempty"`
}

// stepChain is the state after some steps: what the next step's key
// chains from, the layers so far and the configuration they set.
type stepChain struct {
	key     string
	layers  []string
	records []StepRecord
	config  ociimage.Config
}

// stepsFormatVersion changes when steps are keyed or run differently.
const stepsFormatVersion = 1

// buildVMMinMemoryMiB is a build VM's least memory: the changes of a Run
// step are held in the guest's RAM (a tmpfs) until they are read back.
const buildVMMinMemoryMiB = 1024

func stepsDir(dataDir string) string { return filepath.Join(dataDir, "cache", "steps") }

// stepIndex is DataDir/cache/steps/<key>.json.
type stepIndex struct {
	Key     string    `json:"key"`
	Origin  string    `json:"origin"`
	Layer   string    `json:"layer"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
}

// chainStart is the chain before the first step. A tenant's chain is its
// own: its keys differ from anyone else's, so one tenant never gets a
// layer another tenant's build made (whose RUN ran under that tenant's
// network policy and inputs).
func chainStart(from *ociimage.Image, tenant string) *stepChain {
	seed := fmt.Sprintf("forkd-steps\nformat=%d\nfrom=%s\n", stepsFormatVersion, from.Digest)
	if tenant != "" {
		seed += "tenant=" + tenant + "\n"
	}
	sum := sha256.Sum256([]byte(seed))
	c := from.Config
	c.Env = append([]string(nil), c.Env...)
	return &stepChain{key: hex.EncodeToString(sum[:]), config: c}
}

// next returns the chain after step s with the given inputs hash.
func (c *stepChain) next(s recipe.Step, inputs, layer string) *stepChain {
	s.Origin = "" // where a step is written does not change what it does
	data, _ := json.Marshal(s)
	sum := sha256.Sum256([]byte(c.key + "\n" + string(data) + "\n" + inputs))
	n := &stepChain{key: hex.EncodeToString(sum[:]), config: c.config}
	n.config.Env = append([]string(nil), c.config.Env...)
	n.layers = append([]string(nil), c.layers...)
	n.records = append([]StepRecord(nil), c.records...)
	if layer != "" {
		n.layers = append(n.layers, layer)
	}
	return n
}

// runSteps runs (or finds cached) r's steps on from. The caller holds the
// layer cache.
func (b *Builder) runSteps(ctx context.Context, r *recipe.Recipe, from *ociimage.Image, k *Kernel, release string, started time.Time) (*stepChain, error) {
	say := progressFunc(b.Progress)
	chain := chainStart(from, b.Tenant)
	cache := ociimage.Cache{Dir: LayerCacheDir(b.DataDir)}
	var bootFiles *buildBoot
	defer func() {
		if bootFiles != nil {
			removeTree(bootFiles.dir)
		}
	}()
	for i, s := range r.Steps {
		what := fmt.Sprintf("step %d/%d %s", i+1, len(r.Steps), s.Origin)
		switch s.Kind {
		case recipe.StepEnv, recipe.StepWorkdir, recipe.StepUser, recipe.StepCmd, recipe.StepEntrypoint:
			chain = chain.next(s, "", "")
			applyConfig(&chain.config, s)
			chain.records = append(chain.records, StepRecord{Origin: s.Origin, Key: chain.key})
			continue
		}
		inputs := ""
		var files []copyFile
		if s.Kind == recipe.StepCopy {
			var err error
			if files, inputs, err = copyInputs(s, r.Context); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
		}
		key := chain.next(s, inputs, "").key
		layer, ok := b.cachedStep(key, cache)
		if ok {
			say("%s: cached (%s)", what, layer[7:19])
		} else {
			start := time.Now()
			w, err := cache.NewLayer(b.maxLayerBytes())
			if err != nil {
				return nil, err
			}
			if s.Kind == recipe.StepCopy {
				say("%s: copying %d files", what, len(files))
				err = writeCopyLayer(w, files)
			} else {
				say("%s: running in a build VM", what)
				err = b.runInVM(ctx, r, s, chain, from, k, release, started, &bootFiles, w)
			}
			if err != nil {
				w.Abort()
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			var size int64
			if layer, size, err = w.Commit(); err != nil {
				return nil, err
			}
			if err := b.recordStep(stepIndex{Key: key, Origin: s.Origin, Layer: layer, Size: size, Created: time.Now().UTC()}); err != nil {
				return nil, err
			}
			say("%s: layer %s, %d KB in %s", what, layer[7:19], size>>10, time.Since(start).Round(time.Millisecond))
		}
		chain = chain.next(s, inputs, layer)
		chain.records = append(chain.records, StepRecord{Origin: s.Origin, Key: chain.key, Layer: layer})
	}
	return chain, nil
}

// applyConfig sets what an Env, Workdir or User step sets.
func applyConfig(c *ociimage.Config, s recipe.Step) {
	switch s.Kind {
	case recipe.StepEnv:
		kv := s.Key + "=" + s.Value
		for i, old := range c.Env {
			if k, _, _ := strings.Cut(old, "="); k == s.Key {
				c.Env[i] = kv
				return
			}
		}
		c.Env = append(c.Env, kv)
	case recipe.StepWorkdir:
		c.WorkingDir = s.Value
	case recipe.StepUser:
		c.User = s.Value
	case recipe.StepCmd:
		c.Cmd = append([]string(nil), s.Argv...)
	case recipe.StepEntrypoint:
		c.Entrypoint = append([]string(nil), s.Argv...)
		if s.Value == recipe.ResetCmd {
			c.Cmd = nil
		}
	}
}

func (b *Builder) maxLayerBytes() int64 {
	if b.PullLimits.MaxBytes > 0 {
		return b.PullLimits.MaxBytes
	}
	return ociimage.DefaultLimits.MaxBytes
}

// cachedStep returns the layer recorded for key, if it is still cached.
func (b *Builder) cachedStep(key string, cache ociimage.Cache) (string, bool) {
	data, err := os.ReadFile(filepath.Join(stepsDir(b.DataDir), key+".json"))
	if err != nil {
		return "", false
	}
	var ix stepIndex
	if json.Unmarshal(data, &ix) != nil || ix.Key != key || !cache.Has(ix.Layer) {
		return "", false
	}
	return ix.Layer, true
}

// recordStep writes a step's index entry: staged, fsynced, renamed.
func (b *Builder) recordStep(ix stepIndex) error {
	dir := stepsDir(b.DataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ix.Key+".json"), append(data, '\n'), 0o644)
}

// buildBoot is the kernel and initramfs build VMs boot, made once per
// build that runs a step.
type buildBoot struct {
	dir    string
	kernel string
	initrd string
}

// runInVM runs a Run step in a VM booted from the image of chain.
func (b *Builder) runInVM(ctx context.Context, r *recipe.Recipe, s recipe.Step, chain *stepChain, from *ociimage.Image, k *Kernel,
	release string, started time.Time, boot **buildBoot, w *ociimage.LayerWriter) error {
	if b.Steps == nil {
		return fmt.Errorf("this builder cannot run build steps (no StepRunner; build through the daemon): %w", errdefs.ErrNotImplemented)
	}
	if *boot == nil {
		stage, err := newStaging(stepsDir(b.DataDir))
		if err != nil {
			return err
		}
		bb := &buildBoot{dir: stage, kernel: k.Vmlinuz, initrd: filepath.Join(stage, initrdName)}
		*boot = bb
		info, _ := json.Marshal(map[string]string{"recipe": r.Name, "purpose": "build step"})
		if err := writeInitramfs(bb.initrd, b.AgentBinary, k, append(info, '\n')); err != nil {
			return fmt.Errorf("build VM initramfs: %w", err)
		}
	}
	rfs, err := b.rootfs(ctx, r, from, release, started, chain)
	if err != nil {
		return err
	}
	env := map[string]string{}
	for k, v := range s.BuildEnv {
		env[k] = v
	}
	for _, kv := range chain.config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return b.Steps.RunStep(ctx, StepSpec{
		Image:     vmm.Image{Kernel: (*boot).kernel, Initrd: (*boot).initrd, Rootfs: rfs.Path},
		MemoryMiB: max(r.MemoryMiB, buildVMMinMemoryMiB), VCPUs: r.VCPUs,
		Step: s, Env: env, Workdir: chain.config.WorkingDir, User: chain.config.User,
		MaxLayerBytes: b.maxLayerBytes(), Output: b.Progress,
	}, w)
}

// applyChain applies chain's layers and configuration to tree, which
// holds the from image's files.
func (b *Builder) applyChain(ctx context.Context, tree string, chain *stepChain) error {
	if _, err := (ociimage.Cache{Dir: LayerCacheDir(b.DataDir)}).ApplyLayers(ctx, tree, chain.layers, b.PullLimits); err != nil {
		return err
	}
	if d := chain.config.WorkingDir; d != "" {
		// WORKDIR creates the directory, as Docker's does.
		if err := ociimage.MkdirAll(tree, d); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("workdir %s: %w", d, err)
		}
	}
	return nil
}
