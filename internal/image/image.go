package image

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// File names inside an image directory.
const (
	manifestName = "image.json"
	kernelName   = "vmlinuz"
	initrdName   = "initrd.img"
	rootfsName   = "rootfs.ext4"
)

// FileInfo identifies one file of an image.
type FileInfo struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Image is a built guest image: a directory DataDir/images/<Digest>/ whose
// files never change after it is published.
type Image struct {
	Digest       string
	Recipe       string // recipe name
	RecipeDigest string
	Description  string
	Base         string
	Packages     []string
	// From is the OCI image the root file system came from (recipe from);
	// nil for a base.
	From *Source
	// Steps are the build steps applied on From (recipe run, files, env,
	// workdir, user; a Dockerfile), with the layers they made.
	Steps []StepRecord
	Dir   string

	// Paths of the boot files.
	Kernel string
	Initrd string
	Rootfs string
	// RootfsKey names the cached root file system it was built from
	// (DataDir/cache/rootfs/<key>).
	RootfsKey string

	KernelVersion        string // uname -r in the guest
	KernelPackage        string
	KernelPackageVersion string

	MemoryMiB     int
	VCPUs         int
	PythonEnabled bool
	PythonWarm    string // code the Python session runs before the snapshot

	Created time.Time
	// Files maps the file names in Dir (vmlinuz, initrd.img, rootfs.ext4) to
	// their size and SHA-256.
	Files map[string]FileInfo
}

// VMM returns the files a VMM driver boots.
func (img *Image) VMM() vmm.Image {
	return vmm.Image{Kernel: img.Kernel, Initrd: img.Initrd, Rootfs: img.Rootfs}
}

// manifest is image.json. It is written once, last, inside the staging
// directory, so an image directory with a readable manifest is complete.
type manifest struct {
	FormatVersion int    `json:"format_version"`
	Digest        string `json:"digest"`
	Recipe        struct {
		Name        string `json:"name"`
		Digest      string `json:"digest"`
		Description string `json:"description,omitempty"`
	} `json:"recipe"`
	Base     string       `json:"base"`
	Packages []string     `json:"packages"`
	From     *Source      `json:"from,omitempty"`
	Steps    []StepRecord `json:"steps,omitempty"`
	Kernel   struct {
		Version        string `json:"version"`
		Package        string `json:"package"`
		PackageVersion string `json:"package_version"`
	} `json:"kernel"`
	Rootfs struct {
		Key     string `json:"key"`
		Release string `json:"release"`
		SHA256  string `json:"sha256"`
	} `json:"rootfs"`
	AgentSHA256 string `json:"agent_sha256"`
	MemoryMiB   int    `json:"memory_mib"`
	VCPUs       int    `json:"vcpus"`
	Python      struct {
		Enabled bool   `json:"enabled"`
		Warm    string `json:"warm,omitempty"`
	} `json:"python"`
	Files   map[string]FileInfo `json:"files"`
	Created time.Time           `json:"created"`
}

func imagesDir(dataDir string) string { return filepath.Join(dataDir, "images") }

// loadImage reads one image directory.
func loadImage(dir string) (*Image, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v: %w", filepath.Join(dir, manifestName), err, errdefs.ErrInternal)
	}
	if m.FormatVersion != formatVersion {
		return nil, fmt.Errorf("%s: image format %d, this forkd reads %d (rebuild it): %w",
			dir, m.FormatVersion, formatVersion, errdefs.ErrFailedPrecondition)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	return &Image{
		Digest:               m.Digest,
		Recipe:               m.Recipe.Name,
		RecipeDigest:         m.Recipe.Digest,
		Description:          m.Recipe.Description,
		Base:                 m.Base,
		Packages:             m.Packages,
		From:                 m.From,
		Steps:                m.Steps,
		Dir:                  abs,
		Kernel:               filepath.Join(abs, kernelName),
		Initrd:               filepath.Join(abs, initrdName),
		Rootfs:               filepath.Join(abs, rootfsName),
		RootfsKey:            m.Rootfs.Key,
		KernelVersion:        m.Kernel.Version,
		KernelPackage:        m.Kernel.Package,
		KernelPackageVersion: m.Kernel.PackageVersion,
		MemoryMiB:            m.MemoryMiB,
		VCPUs:                m.VCPUs,
		PythonEnabled:        m.Python.Enabled,
		PythonWarm:           m.Python.Warm,
		Created:              m.Created,
		Files:                m.Files,
	}, nil
}

// List returns the images under dataDir, newest first. Directories without
// a readable manifest (none should exist) are skipped.
func List(dataDir string) ([]*Image, error) {
	ents, err := os.ReadDir(imagesDir(dataDir))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Image
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		img, err := loadImage(filepath.Join(imagesDir(dataDir), e.Name()))
		if err != nil {
			continue
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.After(out[j].Created)
		}
		return out[i].Digest < out[j].Digest
	})
	return out, nil
}

// Open finds one image by full digest, recipe name (the newest image of that
// recipe) or a unique digest prefix of at least 4 characters.
func Open(dataDir, ref string) (*Image, error) {
	if ref == "" {
		return nil, fmt.Errorf("empty image reference: %w", errdefs.ErrInvalidArgument)
	}
	if isDigest(ref) {
		return openDigest(dataDir, ref)
	}
	all, err := List(dataDir)
	if err != nil {
		return nil, err
	}
	for _, img := range all { // newest first
		if img.Recipe == ref {
			return img, nil
		}
	}
	return matchPrefix(all, ref)
}

// openDigest opens an image by its full digest.
func openDigest(dataDir, digest string) (*Image, error) {
	img, err := loadImage(filepath.Join(imagesDir(dataDir), digest))
	if os.IsNotExist(err) {
		all, _ := List(dataDir)
		return nil, notFound(digest, all)
	}
	return img, err
}

// matchPrefix picks the one image whose digest starts with prefix.
func matchPrefix(all []*Image, prefix string) (*Image, error) {
	if len(prefix) >= 4 && isHex(prefix) {
		var hits []*Image
		for _, img := range all {
			if strings.HasPrefix(img.Digest, prefix) {
				hits = append(hits, img)
			}
		}
		if len(hits) == 1 {
			return hits[0], nil
		}
		if len(hits) > 1 {
			return nil, fmt.Errorf("image prefix %q is ambiguous (%s): %w", prefix, describe(hits), errdefs.ErrInvalidArgument)
		}
	}
	return nil, notFound(prefix, all)
}

func notFound(ref string, all []*Image) error {
	known := "none; build one first"
	if len(all) > 0 {
		known = describe(all)
	}
	return fmt.Errorf("image %q not found (known: %s): %w", ref, known, errdefs.ErrNotFound)
}

// Remove deletes an image given its digest or a unique digest prefix. It
// does not know which snapshots were made from the image: callers check.
// The directory is first renamed out of sight, so a crash mid-way leaves no
// half image under its digest.
func Remove(dataDir, digest string) error {
	if !isHex(digest) {
		return fmt.Errorf("image digest %q is not a hex digest or prefix (Remove takes no recipe names): %w", digest, errdefs.ErrInvalidArgument)
	}
	var img *Image
	var err error
	if isDigest(digest) {
		img, err = openDigest(dataDir, digest)
	} else {
		all, lerr := List(dataDir)
		if lerr != nil {
			return lerr
		}
		img, err = matchPrefix(all, digest)
	}
	if err != nil {
		return err
	}
	dir := imagesDir(dataDir)
	unlock, err := lockFile(context.Background(), filepath.Join(dir, ".locks", img.Digest+".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	trash := filepath.Join(dir, fmt.Sprintf("%s%d-rm-%s", stagingPrefix, os.Getpid(), img.Digest[:12]))
	if err := os.Rename(img.Dir, trash); err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("image %s: %w", img.Digest, errdefs.ErrNotFound)
		}
		return err
	}
	if err := syncPath(dir); err != nil {
		return err
	}
	return removeTree(trash)
}

func describe(imgs []*Image) string {
	parts := make([]string, len(imgs))
	for i, img := range imgs {
		parts[i] = fmt.Sprintf("%s %s", img.Recipe, img.Digest[:min(12, len(img.Digest))])
	}
	return strings.Join(parts, ", ")
}

func isDigest(s string) bool { return len(s) == 64 && isHex(s) }

func isHex(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
