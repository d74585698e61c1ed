package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// guestModule is a kernel module the guest agent loads at boot. Debian's
// cloud kernel builds the virtio transports and drivers as modules, and the
// guest has no modprobe: the agent calls finit_module on each file in the
// order /etc/forkd-modules gives.
type guestModule struct {
	name     string
	optional bool // absent from some kernels; skipped there
	why      string
}

var guestModules = []guestModule{
	{name: "virtio_ring", why: "virtqueues, used by every virtio driver"},
	{name: "virtio", why: "virtio bus"},
	{name: "virtio_mmio", why: "microvm's virtio transport (devices found through ACPI)"},
	{name: "virtio_console", why: "virtio-serial: the agent's channel under QEMU"},
	{name: "virtio_blk", why: "the root file system disk"},
	{name: "failover", why: "needed by virtio_net"},
	{name: "net_failover", why: "needed by virtio_net"},
	{name: "virtio_net", why: "the sandbox NIC"},
	{name: "overlay", why: "writable tmpfs layer over the read-only root"},
	{name: "vsock", why: "vsock: the agent's channel under Firecracker"},
	{name: "vmw_vsock_virtio_transport_common", why: "virtio vsock"},
	{name: "vmw_vsock_virtio_transport", why: "virtio vsock"},
	{name: "virtio_rng", optional: true, why: "entropy from the host when a virtio-rng device is attached"},
}

// modName normalizes a module file or dependency name: the kernel treats
// '-' and '_' alike in module names (virtio-rng.ko is module virtio_rng).
func modName(s string) string {
	s = filepath.Base(s)
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz", ".ko"} {
		if t, ok := strings.CutSuffix(s, ext); ok {
			s = t
			break
		}
	}
	return strings.ReplaceAll(s, "-", "_")
}

// indexModules maps module names to their files under a kernel's
// lib/modules/<version> tree.
func indexModules(root string) (map[string]string, error) {
	idx := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.Contains(d.Name(), ".ko") {
			if _, dup := idx[modName(d.Name())]; !dup {
				idx[modName(d.Name())] = p
			}
		}
		return nil
	})
	return idx, err
}

// installModules resolves the guest modules and their dependencies in
// kernel tree modRoot, writes each as a plain <name>.ko into outDir and
// returns the file names in load order (dependencies first). Order comes from
// each module's own "depends=" field rather than from guestModules' order,
// so a kernel whose dependencies differ still loads.
func installModules(ctx context.Context, modRoot, outDir string) ([]string, error) {
	idx, err := indexModules(modRoot)
	if err != nil {
		return nil, fmt.Errorf("index modules in %s: %w", modRoot, err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("module dependency cycle: %s -> %s: %w", strings.Join(chain, " -> "), name, errdefs.ErrInternal)
		}
		src, ok := idx[name]
		if !ok {
			return fmt.Errorf("module %s (needed by %s) is not in the kernel package: %w",
				name, strings.Join(chain, " -> "), errdefs.ErrFailedPrecondition)
		}
		state[name] = visiting
		file := name + ".ko"
		dst := filepath.Join(outDir, file)
		if err := plainModule(ctx, src, dst); err != nil {
			return err
		}
		deps, err := moduleDepends(dst)
		if err != nil {
			return err
		}
		next := append(append([]string(nil), chain...), name)
		for _, d := range deps {
			if err := visit(d, next); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, file)
		return nil
	}
	for _, m := range guestModules {
		if _, ok := idx[m.name]; !ok {
			if m.optional {
				continue
			}
			return nil, fmt.Errorf("module %s (%s) is not in the kernel package: %w", m.name, m.why, errdefs.ErrFailedPrecondition)
		}
		if err := visit(m.name, []string{"guest"}); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// plainModule writes src to dst uncompressed. The guest loads modules with
// finit_module, which takes compressed files only on kernels built with
// in-kernel decompression; decompressing here works everywhere.
func plainModule(ctx context.Context, src, dst string) error {
	var data []byte
	var err error
	switch {
	case strings.HasSuffix(src, ".ko"):
		data, err = os.ReadFile(src)
	case strings.HasSuffix(src, ".ko.gz"):
		data, err = gunzipFile(src)
	case strings.HasSuffix(src, ".ko.xz"):
		data, err = run(ctx, command{name: "xz", args: []string{"-dc", src}})
	case strings.HasSuffix(src, ".ko.zst"):
		data, err = run(ctx, command{name: "zstd", args: []string{"-dcq", src}})
	default:
		err = fmt.Errorf("unknown module compression: %w", errdefs.ErrInternal)
	}
	if err != nil {
		return fmt.Errorf("module %s: %w", filepath.Base(src), err)
	}
	return writeFileSync(dst, data, 0o644)
}

func gunzipFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// moduleDepends reads the "depends=" field of a module's .modinfo section,
// the same data `modinfo -F depends` prints, without needing kmod on the host.
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("module %s: not an ELF object: %v: %w", filepath.Base(path), err, errdefs.ErrInternal)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section: %w", filepath.Base(path), errdefs.ErrInternal)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: read .modinfo: %v: %w", filepath.Base(path), err, errdefs.ErrInternal)
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			for _, d := range strings.Split(string(v), ",") {
				if d = strings.TrimSpace(d); d != "" {
					deps = append(deps, modName(d))
				}
			}
		}
	}
	return deps, nil
}
