package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// rootfsFormatVersion changes whenever the builder lays out a root file
// system differently (directories, /etc files, mkfs options), so that
// cached ones made the old way are not reused.
const rootfsFormatVersion = 1

const rootfsManifestName = "rootfs.json"

// rootfsInfo is rootfs.json next to a cached rootfs.ext4.
type rootfsInfo struct {
	FormatVersion int      `json:"format_version"`
	Key           string   `json:"key"`
	RecipeKey     string   `json:"recipe_key"`
	Base          string   `json:"base"`
	Packages      []string `json:"packages"`
	Release       string   `json:"release"`
	Arch          string   `json:"arch"`
	// Installed maps every Debian package in the image to its version.
	Installed map[string]string `json:"installed"`
	// From is the OCI image the tree was unpacked from (recipe from).
	From *Source `json:"from,omitempty"`
	// Steps are the build steps applied on From.
	Steps        []StepRecord `json:"steps,omitempty"`
	ContentBytes int64        `json:"content_bytes"`
	File         FileInfo     `json:"file"`
	BuildSeconds float64      `json:"build_seconds"`
	Built        time.Time    `json:"built"`
}

// cachedRootfs is a published root file system.
type cachedRootfs struct {
	Path string
	Info rootfsInfo
}

// rootfsKey identifies a root file system: what the recipe installs, and
// the Debian release and architecture it comes from, or the digest of the
// OCI image it is unpacked from (from: a tag that moves is a new key).
// chain, after build steps, adds the key of the last (which covers the
// steps before it and the from image).
func rootfsKey(r *recipe.Recipe, release string, from *ociimage.Image, chain *stepChain) string {
	in := fmt.Sprintf("forkd-rootfs\nformat=%d\nrecipe=%s\nrelease=%s\narch=%s\n",
		rootfsFormatVersion, r.RootfsKey(), release, runtime.GOARCH)
	if from != nil {
		in += "from=" + from.Digest + "\n"
	}
	if chain != nil {
		in += "steps=" + chain.key + "\n"
	}
	sum := sha256.Sum256([]byte(in))
	return hex.EncodeToString(sum[:])
}

// rootfs returns the cached root file system for r, building it first when
// it is missing (or when b.Refresh asks for a rebuild).
// started is when the calling Build began: with Refresh, a rootfs another
// build published after it is fresh enough.
// from is the resolved image of a recipe with from, else nil; chain the
// build steps applied on it (all of them, or those before a Run step's),
// else nil.
func (b *Builder) rootfs(ctx context.Context, r *recipe.Recipe, from *ociimage.Image, release string, started time.Time, chain *stepChain) (*cachedRootfs, error) {
	say := progressFunc(b.Progress)
	key := rootfsKey(r, release, from, chain)
	cacheDir := filepath.Join(b.DataDir, "cache", "rootfs")
	dir := filepath.Join(cacheDir, key)
	if !b.Refresh {
		if c, err := loadRootfs(dir); err == nil {
			return c, nil
		}
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".locks", key+".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c, err := loadRootfs(dir); err == nil && (!b.Refresh || c.Info.Built.After(started)) {
		// Built by another process while we waited for the lock.
		return c, nil
	}

	start := time.Now()
	stage, err := newStaging(cacheDir)
	if err != nil {
		return nil, err
	}
	defer removeTree(stage)
	tree, out := filepath.Join(stage, "tree"), filepath.Join(stage, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	info := rootfsInfo{
		FormatVersion: rootfsFormatVersion,
		Key:           key,
		RecipeKey:     r.RootfsKey(),
		Base:          r.Base,
		Packages:      r.Packages,
		Release:       release,
		Arch:          runtime.GOARCH,
	}
	what := "base " + r.Base
	switch {
	case from != nil:
		what = "from " + from.Ref
		if info.From, err = b.ociTree(ctx, from, tree); err == nil && chain != nil {
			what += fmt.Sprintf(" + %d steps", len(chain.records))
			info.Steps = chain.records
			err = b.applyChain(ctx, tree, chain)
		}
	case r.Base == recipe.BaseBusybox:
		info.Installed, err = b.busyboxTree(ctx, stage, tree)
	case r.Base == recipe.BaseDebian:
		info.Installed, err = b.debianTree(ctx, r, release, stage, tree)
	default:
		err = fmt.Errorf("base %q: %w", r.Base, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("root file system (%s): %w", what, err)
	}
	if err := finishTree(tree); err != nil {
		return nil, err
	}
	if info.From != nil {
		config := info.From.Config
		if chain != nil {
			config = chain.config
		}
		if err := writeImageConfig(tree, config); err != nil {
			return nil, err
		}
	}
	img := filepath.Join(out, rootfsName)
	say("rootfs: mkfs.ext4")
	content, err := makeExt4(ctx, tree, img)
	if err != nil {
		return nil, err
	}
	info.ContentBytes = content
	// The tree is no longer needed; drop it before fsyncing the output.
	if err := removeTree(tree); err != nil {
		return nil, err
	}
	if err := os.Chmod(img, 0o444); err != nil {
		return nil, err
	}
	if info.File, err = fileDigest(img); err != nil {
		return nil, err
	}
	info.BuildSeconds = time.Since(start).Seconds()
	info.Built = time.Now().UTC()
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFileSync(filepath.Join(out, rootfsManifestName), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if _, err := os.Stat(dir); err == nil {
		// A refresh replaces the cached copy; images made from it keep
		// their own hard links to the old file.
		old := filepath.Join(cacheDir, fmt.Sprintf("%s%d-old-%s", stagingPrefix, os.Getpid(), key[:12]))
		if err := os.Rename(dir, old); err != nil {
			return nil, err
		}
		defer removeTree(old)
	}
	if err := publish(out, dir); err != nil {
		return nil, err
	}
	say("rootfs: %s ready in %s (%d MB of files, image %d MB, %d MB allocated)",
		what, time.Since(start).Round(100*time.Millisecond), content>>20, info.File.Size>>20, allocated(filepath.Join(dir, rootfsName))>>20)
	return loadRootfs(dir)
}

// loadRootfs reads a published root file system.
func loadRootfs(dir string) (*cachedRootfs, error) {
	data, err := os.ReadFile(filepath.Join(dir, rootfsManifestName))
	if err != nil {
		return nil, err
	}
	var info rootfsInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, err
	}
	if info.FormatVersion != rootfsFormatVersion {
		return nil, fmt.Errorf("%s: format %d: %w", dir, info.FormatVersion, errdefs.ErrFailedPrecondition)
	}
	p := filepath.Join(dir, rootfsName)
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if st.Size() != info.File.Size {
		return nil, fmt.Errorf("%s: size %d, manifest says %d: %w", p, st.Size(), info.File.Size, errdefs.ErrInternal)
	}
	return &cachedRootfs{Path: p, Info: info}, nil
}

// finishTree adds what every guest root needs and no base provides
// reliably: mount points the agent uses and a minimal /etc. A tree from an
// OCI image is untrusted: where one of these directories is a symlink or
// a file, it is replaced by a real directory, so that nothing written here
// follows a link out of the tree.
func finishTree(tree string) error {
	for _, d := range []struct {
		name string
		perm os.FileMode
	}{
		{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"run", 0o755}, {"mnt", 0o755},
		{"tmp", 0o1777}, {"root", 0o700}, {"etc", 0o755}, {"var", 0o755}, {"var/tmp", 0o1777},
	} {
		p := filepath.Join(tree, d.name)
		if st, err := os.Lstat(p); err == nil && !st.IsDir() {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		// MkdirAll leaves an existing directory alone and is subject to the
		// umask; set the mode explicitly (sticky /tmp matters).
		if err := os.Chmod(p, d.perm|sticky(d.perm)); err != nil {
			return err
		}
	}
	// Identity files are always ours: mmdebstrap leaves the build host's
	// hostname behind, and the agent rewrites these per sandbox anyway.
	always := map[string]string{
		"etc/hostname": "forkd\n",
		"etc/hosts":    "127.0.0.1\tlocalhost forkd\n::1\t\tlocalhost ip6-localhost ip6-loopback\n",
		// Empty: a sandbox has no network until one is attached, and the
		// agent writes this file when it is.
		"etc/resolv.conf": "",
	}
	// Account files only where the base brings none (busybox); Debian's own
	// passwd and group list its system users.
	ifMissing := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, content := range always {
		p := filepath.Join(tree, name)
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	for name, content := range ifMissing {
		p := filepath.Join(tree, name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// sticky converts Go's permission bits with the sticky bit set in the Unix
// way (0o1777) into os.FileMode's ModeSticky.
func sticky(perm os.FileMode) os.FileMode {
	if perm&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

// makeExt4 writes tree into a new ext4 image at img and returns the bytes
// of content. The image is sized from the tree (content, metadata and a
// small margin; the root is read-only, so free space is waste) and is
// created sparse by mke2fs, so unused blocks take no disk space. If the
// estimate is short, mkfs fails and the next attempt is half as big again.
func makeExt4(ctx context.Context, tree, img string) (int64, error) {
	u, err := measureTree(tree)
	if err != nil {
		return 0, err
	}
	inodes := u.inodes + u.inodes/8 + 256
	metadata := inodes*256 + u.inodes*64 // inode tables, plus extent blocks of big files
	size := u.blocks*4096 + metadata
	size += size/10 + 8<<20
	for attempt := 0; ; attempt++ {
		size = (size + 1<<20 - 1) &^ (1<<20 - 1)
		os.Remove(img)
		_, err := run(ctx, command{name: "mkfs.ext4", args: []string{
			"-q", "-t", "ext4", "-d", tree, "-L", "root",
			// No journal: the file system is never written at run time.
			"-O", "^has_journal,^resize_inode",
			"-E", "root_owner=0:0",
			// "default" also for small images: mke2fs would otherwise pick
			// 1 KiB blocks below 512 MiB.
			"-T", "default", "-b", "4096", "-I", "256",
			"-N", fmt.Sprint(inodes), "-m", "0",
			img, fmt.Sprintf("%dk", size>>10),
		}})
		if err == nil {
			return u.bytes, nil
		}
		var ce *commandError
		if attempt < 3 && errors.As(err, &ce) && isNoSpace(ce.stderr) {
			size += size / 2
			continue
		}
		os.Remove(img)
		return 0, fmt.Errorf("mkfs.ext4 of %d MB: %w", size>>20, err)
	}
}

func isNoSpace(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "could not allocate") || strings.Contains(msg, "no space") ||
		strings.Contains(msg, "no free space")
}

// treeUsage is what a directory tree needs on ext4 with 4 KiB blocks.
type treeUsage struct {
	bytes  int64 // sum of file sizes
	blocks int64 // data and directory blocks
	inodes int64
}

func measureTree(root string) (treeUsage, error) {
	var u treeUsage
	seen := map[[2]uint64]bool{} // hard links share one inode
	dirEntries := map[string]int64{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			// ext4 directory entries: 8 bytes + name, 4-byte aligned.
			dirEntries[filepath.Dir(p)] += (8 + int64(len(d.Name())) + 3) &^ 3
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && !d.IsDir() && st.Nlink > 1 {
			k := [2]uint64{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		u.inodes++
		switch {
		case d.Type().IsRegular():
			u.bytes += info.Size()
			u.blocks += (info.Size() + 4095) / 4096
		case d.Type()&fs.ModeSymlink != 0:
			// Targets of 60 bytes or more do not fit in the inode.
			if info.Size() >= 60 {
				u.blocks++
			}
		}
		return nil
	})
	for _, n := range dirEntries {
		u.blocks += 1 + n/4096
	}
	return u, err
}

// allocated is the disk space a (sparse) file takes.
func allocated(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
