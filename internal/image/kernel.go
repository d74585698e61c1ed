package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Kernel is a guest kernel unpacked from Debian's cloud kernel package,
// with the modules the guest agent loads. Its files never change once
// published: a newer package version gets a new directory.
type Kernel struct {
	Version        string // uname -r, e.g. 6.1.0-57-cloud-amd64
	Package        string // e.g. linux-image-6.1.0-57-cloud-amd64
	PackageVersion string // Debian version of Package, e.g. 6.1.192-3
	Vmlinuz        string // absolute path of the bzImage
	ModulesDir     string // flat directory of uncompressed .ko files
	// Modules are file names in ModulesDir, in load order (each after the
	// modules it depends on).
	Modules []string
	Dir     string // the cache directory holding all of the above
	// VmlinuzSHA256 is the kernel image's digest, recorded at fetch time.
	VmlinuzSHA256 string
}

// kernelManifest is kernel.json in a cached kernel directory.
type kernelManifest struct {
	FormatVersion  int       `json:"format_version"`
	Version        string    `json:"version"`
	Package        string    `json:"package"`
	PackageVersion string    `json:"package_version"`
	Modules        []string  `json:"modules"`
	VmlinuzSHA256  string    `json:"vmlinuz_sha256"`
	Fetched        time.Time `json:"fetched"`
}

const (
	kernelFormatVersion = 1
	kernelManifestName  = "kernel.json"
	// kernelCurrent names the package version FetchKernel returns; only
	// RefreshKernel moves it.
	kernelCurrent = "current"
)

// kernelMetaPackage is Debian's package that depends on the newest cloud
// kernel for this architecture.
func kernelMetaPackage() (string, error) {
	switch runtime.GOARCH {
	case "amd64", "arm64":
		return "linux-image-cloud-" + runtime.GOARCH, nil
	}
	return "", fmt.Errorf("no Debian cloud kernel for %s: %w", runtime.GOARCH, errdefs.ErrNotImplemented)
}

// FetchKernel returns the guest kernel cached under cacheDir/kernel. Once a
// kernel is cached it is returned without asking apt (a few stats and one
// small file read): images and snapshots are tied to one exact kernel, so a
// newer Debian kernel is taken only when RefreshKernel asks for it. With an
// empty cache it behaves like RefreshKernel. progress, if not nil, receives
// one-line status messages.
func FetchKernel(ctx context.Context, cacheDir string, progress func(string)) (*Kernel, error) {
	kdir := filepath.Join(cacheDir, "kernel")
	if k, err := loadCurrentKernel(kdir); err == nil {
		return k, nil
	}
	return fetchKernel(ctx, kdir, false, progress)
}

// RefreshKernel asks apt for the newest cloud kernel package, fetches it
// unless it is cached, and makes it the one FetchKernel returns. Kernels
// fetched before stay cached for the images that use them.
func RefreshKernel(ctx context.Context, cacheDir string, progress func(string)) (*Kernel, error) {
	return fetchKernel(ctx, filepath.Join(cacheDir, "kernel"), true, progress)
}

func fetchKernel(ctx context.Context, kdir string, refresh bool, progress func(string)) (*Kernel, error) {
	say := progressFunc(progress)
	unlock, err := lockFile(ctx, filepath.Join(kdir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !refresh {
		// Another process may have fetched it while we waited for the lock.
		if k, err := loadCurrentKernel(kdir); err == nil {
			return k, nil
		}
	}
	if err := requireTools("apt-cache", "apt-get", "dpkg-deb"); err != nil {
		return nil, err
	}
	if err := checkAptLists(); err != nil {
		return nil, err
	}
	meta, err := kernelMetaPackage()
	if err != nil {
		return nil, err
	}
	deps, err := aptDepends(ctx, meta)
	if err != nil {
		return nil, err
	}
	var pkg string
	for _, d := range deps {
		if strings.HasPrefix(d, "linux-image-") && d != meta {
			pkg = d
			break
		}
	}
	if pkg == "" {
		return nil, fmt.Errorf("%s depends on no linux-image package (apt-cache depends: %v); run `apt-get update`: %w",
			meta, deps, errdefs.ErrFailedPrecondition)
	}
	ver, err := aptCandidate(ctx, pkg)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(kdir, dirSafe(ver))
	if k, err := loadKernel(dir); err == nil {
		say("kernel: %s %s already cached", pkg, ver)
		return k, setCurrentKernel(kdir, ver)
	}
	start := time.Now()
	say("kernel: fetching %s %s", pkg, ver)
	if err := buildKernelDir(ctx, kdir, dir, pkg, ver); err != nil {
		return nil, fmt.Errorf("kernel %s %s: %w", pkg, ver, err)
	}
	if err := setCurrentKernel(kdir, ver); err != nil {
		return nil, err
	}
	k, err := loadKernel(dir)
	if err != nil {
		return nil, err
	}
	say("kernel: %s ready with %d modules in %s", k.Version, len(k.Modules), time.Since(start).Round(time.Millisecond))
	return k, nil
}

// buildKernelDir downloads and unpacks pkg and publishes vmlinuz, the
// modules and kernel.json as dir.
func buildKernelDir(ctx context.Context, kdir, dir, pkg, ver string) error {
	stage, err := newStaging(kdir)
	if err != nil {
		return err
	}
	defer removeTree(stage)
	debDir, unpacked, out := filepath.Join(stage, "deb"), filepath.Join(stage, "x"), filepath.Join(stage, "out")
	for _, d := range []string{debDir, unpacked, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	deb, err := aptDownload(ctx, debDir, pkg, ver)
	if err != nil {
		return err
	}
	if err := debExtract(ctx, deb, unpacked); err != nil {
		return err
	}
	vmlinuz, release, err := findVmlinuz(unpacked)
	if err != nil {
		return err
	}
	modRoot := ""
	for _, base := range []string{"lib/modules", "usr/lib/modules"} {
		p := filepath.Join(unpacked, base, release)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			modRoot = p
			break
		}
	}
	if modRoot == "" {
		return fmt.Errorf("package has no modules directory for %s: %w", release, errdefs.ErrFailedPrecondition)
	}
	if err := copySparse(vmlinuz, filepath.Join(out, "vmlinuz")); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(out, "vmlinuz"), 0o444); err != nil {
		return err
	}
	mods, err := installModules(ctx, modRoot, filepath.Join(out, "modules"))
	if err != nil {
		return err
	}
	sum, err := fileDigest(filepath.Join(out, "vmlinuz"))
	if err != nil {
		return err
	}
	m := kernelManifest{
		FormatVersion:  kernelFormatVersion,
		Version:        release,
		Package:        pkg,
		PackageVersion: ver,
		Modules:        mods,
		VmlinuzSHA256:  sum.SHA256,
		Fetched:        time.Now().UTC(),
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(out, kernelManifestName), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		// An incomplete directory (no valid kernel.json) from an older
		// layout: replace it; we hold the kernel lock.
		if err := removeTree(dir); err != nil {
			return err
		}
	}
	return publish(out, dir)
}

// findVmlinuz locates boot/vmlinuz-<release> in an unpacked kernel package.
func findVmlinuz(root string) (path, release string, err error) {
	m, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(m) != 1 {
		return "", "", fmt.Errorf("expected one boot/vmlinuz-* in the package, found %d: %w", len(m), errdefs.ErrFailedPrecondition)
	}
	return m[0], strings.TrimPrefix(filepath.Base(m[0]), "vmlinuz-"), nil
}

// loadCurrentKernel returns the kernel named by kdir/current.
func loadCurrentKernel(kdir string) (*Kernel, error) {
	ver, err := os.ReadFile(filepath.Join(kdir, kernelCurrent))
	if err != nil {
		return nil, err
	}
	return loadKernel(filepath.Join(kdir, dirSafe(strings.TrimSpace(string(ver)))))
}

func setCurrentKernel(kdir, ver string) error {
	return writeFileAtomic(filepath.Join(kdir, kernelCurrent), []byte(ver+"\n"), 0o644)
}

// loadKernel reads a published kernel directory and checks its files exist.
func loadKernel(dir string) (*Kernel, error) {
	data, err := os.ReadFile(filepath.Join(dir, kernelManifestName))
	if err != nil {
		return nil, err
	}
	var m kernelManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v: %w", filepath.Join(dir, kernelManifestName), err, errdefs.ErrInternal)
	}
	if m.FormatVersion != kernelFormatVersion {
		return nil, fmt.Errorf("%s: format %d, want %d: %w", dir, m.FormatVersion, kernelFormatVersion, errdefs.ErrFailedPrecondition)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	k := &Kernel{
		Version:        m.Version,
		Package:        m.Package,
		PackageVersion: m.PackageVersion,
		Vmlinuz:        filepath.Join(abs, "vmlinuz"),
		ModulesDir:     filepath.Join(abs, "modules"),
		Modules:        m.Modules,
		Dir:            abs,
		VmlinuzSHA256:  m.VmlinuzSHA256,
	}
	check := []string{k.Vmlinuz}
	for _, mod := range k.Modules {
		check = append(check, filepath.Join(k.ModulesDir, mod))
	}
	for _, p := range check {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("cached kernel %s is incomplete: %w", dir, errors.Join(err, errdefs.ErrNotFound))
		}
	}
	return k, nil
}

// dirSafe turns a Debian version into a directory name (an epoch's ':' is
// legal in a path but awkward in shells and on some file systems).
func dirSafe(version string) string {
	return strings.NewReplacer(":", "%3a", "/", "_").Replace(version)
}

// progressFunc adapts an optional progress callback to a printf-like one.
func progressFunc(progress func(string)) func(string, ...any) {
	if progress == nil {
		return func(string, ...any) {}
	}
	return func(format string, a ...any) { progress(fmt.Sprintf(format, a...)) }
}
