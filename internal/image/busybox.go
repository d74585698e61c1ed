package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

const busyboxPackage = "busybox-static"

// busyboxTree lays out the "busybox" base in tree: Debian's static busybox
// as /bin/busybox with a symlink for each applet, so that /bin/sh, ls, mount
// and friends work with nothing else installed. It builds in seconds, which
// is why tests use it.
func (b *Builder) busyboxTree(ctx context.Context, stage, tree string) (map[string]string, error) {
	src, ver, err := b.busybox(ctx, filepath.Join(stage, "busybox-deb"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(tree, "bin"), 0o755); err != nil {
		return nil, err
	}
	dst := filepath.Join(tree, "bin", "busybox")
	if err := copySparse(src, dst); err != nil {
		return nil, err
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		return nil, err
	}
	// The binary knows its applets and where each belongs (bin/ls,
	// usr/sbin/chroot, ...). It is a static executable of the host's
	// architecture, so the host can run it.
	out, err := run(ctx, command{name: dst, args: []string{"--list-full"}})
	if err != nil {
		return nil, fmt.Errorf("list busybox applets: %w", err)
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		rel := filepath.Clean(strings.TrimSpace(sc.Text()))
		// linuxrc is for initrd boots; bin/busybox is the binary itself.
		if rel == "." || rel == "linuxrc" || rel == "bin/busybox" || strings.HasPrefix(rel, "..") || filepath.IsAbs(rel) {
			continue
		}
		link := filepath.Join(tree, rel)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return nil, err
		}
		if err := os.Symlink("/bin/busybox", link); err != nil && !os.IsExist(err) {
			return nil, err
		}
		n++
	}
	if _, err := os.Lstat(filepath.Join(tree, "bin", "sh")); err != nil {
		return nil, fmt.Errorf("busybox %s provides no sh applet: %w", ver, errdefs.ErrInternal)
	}
	progressFunc(b.Progress)("rootfs: busybox %s with %d applets", ver, n)
	return map[string]string{busyboxPackage: ver}, nil
}

// BusyboxBinary unpacks Debian's static busybox (the "busybox" base's,
// from the host's apt sources and DataDir/cache/debs) into dir and returns
// its path. Tests use it to assemble images with a shell.
func (b *Builder) BusyboxBinary(ctx context.Context, dir string) (string, error) {
	p, _, err := b.busybox(ctx, dir)
	return p, err
}

// busybox unpacks busybox-static into dir: the binary's path and version.
func (b *Builder) busybox(ctx context.Context, dir string) (path, version string, err error) {
	if err := requireTools("apt-cache", "apt-get", "dpkg-deb"); err != nil {
		return "", "", err
	}
	deb, ver, err := b.cachedDeb(ctx, busyboxPackage)
	if err != nil {
		return "", "", err
	}
	if err := debExtract(ctx, deb, dir); err != nil {
		return "", "", err
	}
	for _, p := range []string{"bin/busybox", "usr/bin/busybox"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
			return filepath.Join(dir, p), ver, nil
		}
	}
	return "", "", fmt.Errorf("%s %s has no bin/busybox: %w", busyboxPackage, ver, errdefs.ErrInternal)
}

// cachedDeb returns the candidate version of pkg as a .deb in
// DataDir/cache/debs, downloading it on the first use of that version.
func (b *Builder) cachedDeb(ctx context.Context, pkg string) (path, version string, err error) {
	if err := checkAptLists(); err != nil {
		return "", "", err
	}
	version, err = aptCandidate(ctx, pkg)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(b.DataDir, "cache", "debs")
	path = filepath.Join(dir, fmt.Sprintf("%s_%s.deb", pkg, dirSafe(version)))
	if _, err := os.Stat(path); err == nil {
		return path, version, nil
	}
	stage, err := newStaging(dir)
	if err != nil {
		return "", "", err
	}
	defer removeTree(stage)
	progressFunc(b.Progress)("rootfs: downloading %s %s", pkg, version)
	deb, err := aptDownload(ctx, stage, pkg, version)
	if err != nil {
		return "", "", err
	}
	if err := syncPath(deb); err != nil {
		return "", "", err
	}
	// Concurrent downloads of the same version write identical files, so
	// the last rename winning is harmless.
	if err := os.Rename(deb, path); err != nil {
		return "", "", err
	}
	return path, version, syncPath(dir)
}
