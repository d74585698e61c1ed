package image

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/vmlinux"
)

func TestFetchKernel(t *testing.T) {
	k := sharedKernel(t)
	if !regexp.MustCompile(`^\d+\.\d+\.\d+-\d+-cloud-(amd64|arm64)$`).MatchString(k.Version) {
		t.Errorf("Version = %q, want like 6.1.0-57-cloud-amd64", k.Version)
	}
	if k.Package != "linux-image-"+k.Version || k.PackageVersion == "" {
		t.Errorf("Package = %q %q, want linux-image-%s and a version", k.Package, k.PackageVersion, k.Version)
	}
	if st, err := os.Stat(k.Vmlinuz); err != nil || st.Size() < 1<<20 {
		t.Errorf("vmlinuz %s: %v (size %v)", k.Vmlinuz, err, st)
	}
	for _, want := range []string{"virtio_ring.ko", "virtio.ko", "virtio_mmio.ko", "virtio_console.ko", "virtio_blk.ko",
		"failover.ko", "net_failover.ko", "virtio_net.ko", "overlay.ko", "vsock.ko",
		"vmw_vsock_virtio_transport_common.ko", "vmw_vsock_virtio_transport.ko"} {
		if !slices.Contains(k.Modules, want) {
			t.Errorf("module %s missing from %v", want, k.Modules)
		}
	}

	// Load order: every module comes after the modules it depends on, as
	// read back from the installed (plain) .ko files.
	pos := map[string]int{}
	for i, m := range k.Modules {
		pos[modName(m)] = i
	}
	for i, m := range k.Modules {
		deps, err := moduleDepends(filepath.Join(k.ModulesDir, m))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range deps {
			j, ok := pos[d]
			if !ok {
				t.Errorf("%s depends on %s, which is not installed", m, d)
			} else if j >= i {
				t.Errorf("%s (position %d) loads before its dependency %s (position %d)", m, i, d, j)
			}
		}
	}
	if pos["virtio_ring"] > pos["virtio_blk"] || pos["failover"] > pos["virtio_net"] {
		t.Errorf("bad order %v", k.Modules)
	}
}

// TestFetchKernelCacheHit: the second call must not touch apt. PATH is
// emptied for the call, so any host command would fail.
func TestFetchKernelCacheHit(t *testing.T) {
	want := sharedKernel(t)
	t.Setenv("PATH", "/nonexistent")
	start := time.Now()
	got, err := FetchKernel(context.Background(), filepath.Join(sharedDir, "cache"), func(s string) {
		t.Errorf("cache hit reported progress %q", s)
	})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached FetchKernel: %v", elapsed)
	if got.Vmlinuz != want.Vmlinuz || got.PackageVersion != want.PackageVersion || !slices.Equal(got.Modules, want.Modules) {
		t.Errorf("cache hit returned %+v, want %+v", got, want)
	}
}

// TestFetchKernelIncompleteCache: a cached kernel with a file missing is not
// used (FetchKernel fetches it again).
func TestFetchKernelIncompleteCache(t *testing.T) {
	k := sharedKernel(t)
	if _, err := loadKernel(k.Dir); err != nil {
		t.Fatalf("complete cache rejected: %v", err)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(k.Dir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "modules", "virtio_blk.ko")); err != nil {
		t.Fatal(err)
	}
	if _, err := loadKernel(dir); err == nil {
		t.Error("kernel with a missing module was accepted")
	}
}

func TestModName(t *testing.T) {
	for in, want := range map[string]string{
		"virtio-rng.ko":                    "virtio_rng",
		"/x/virtio_blk.ko.xz":              "virtio_blk",
		"overlay.ko.zst":                   "overlay",
		"vmw_vsock_virtio_transport.ko":    "vmw_vsock_virtio_transport",
		"vmw_vsock_virtio-transport.ko.gz": "vmw_vsock_virtio_transport",
	} {
		if got := modName(in); got != want {
			t.Errorf("modName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestInstallModulesCompressed: newer Debian kernels ship .ko.xz or .ko.zst;
// the guest gets plain .ko files either way, in the same order.
func TestInstallModulesCompressed(t *testing.T) {
	k := sharedKernel(t)
	requireBinary(t, "xz")
	requireBinary(t, "zstd")
	tree := filepath.Join(t.TempDir(), "lib", "modules", k.Version, "kernel")
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, m := range k.Modules {
		src := filepath.Join(k.ModulesDir, m)
		name := m
		if m == "virtio_rng.ko" {
			name = "virtio-rng.ko" // the file name Debian uses
		}
		dst := filepath.Join(tree, name)
		if err := copySparse(src, dst); err != nil {
			t.Fatal(err)
		}
		var c command
		switch i % 3 {
		case 0:
			c = command{name: "xz", args: []string{"-q", dst}}
		case 1:
			c = command{name: "zstd", args: []string{"-q", "--rm", dst}}
		case 2:
			c = command{name: "gzip", args: []string{"-q", dst}}
			if _, err := lookTool("gzip"); err != nil {
				continue
			}
		}
		if _, err := run(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	got, err := installModules(ctx, filepath.Dir(tree), out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, k.Modules) {
		t.Errorf("order from compressed modules = %v, want %v", got, k.Modules)
	}
	for _, m := range got {
		a, _ := os.ReadFile(filepath.Join(out, m))
		b, _ := os.ReadFile(filepath.Join(k.ModulesDir, m))
		if len(a) == 0 || string(a) != string(b) {
			t.Errorf("%s: decompressed module differs from the original", m)
		}
	}
}

// Firecracker on x86_64 boots an ELF vmlinux, not the bzImage Debian
// ships: the real kernel's payload decompresses to an x86-64 executable.
func TestDebianKernelToELF(t *testing.T) {
	k := sharedKernel(t)
	out, err := vmlinux.Ensure(filepath.Join(t.TempDir(), "unused")) // a missing file is an error, not an ELF
	if err == nil {
		t.Fatalf("Ensure of a missing kernel: %s", out)
	}
	b, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		t.Fatal(err)
	}
	elfBytes, err := vmlinux.Extract(b)
	if err != nil {
		t.Fatalf("%s (%s): %v", k.Vmlinuz, k.PackageVersion, err)
	}
	t.Logf("%s: %d bytes of bzImage, %d of ELF", k.Version, len(b), len(elfBytes))
	if len(elfBytes) < 2*len(b) {
		t.Errorf("ELF of %d bytes from a %d-byte bzImage: want the uncompressed kernel", len(elfBytes), len(b))
	}
}
