// Package image builds the guest images forkd boots: a Debian cloud kernel,
// an initramfs whose /init is forkd-agent, and a read-only ext4 root file
// system made from a recipe (internal/recipe).
//
// # What a guest boots
//
// The kernel is Debian's linux-image-*-cloud-amd64, fetched with apt-get from
// the host's own apt sources (FetchKernel). It has ext4 and the serial
// console built in, but virtio, overlayfs and vsock are modules, so the
// initramfs carries them as plain .ko files in /lib/modules with their load
// order in /etc/forkd-modules; the agent loads them with finit_module, mounts
// /dev/vda read-only and puts a tmpfs-backed overlay on top. The root file
// system is never written, so one file serves a template and all its children.
//
// # Caches and digests
//
// Build is content-addressed. An image lives in DataDir/images/<digest>/,
// where the digest covers the builder's format version, the recipe's bytes,
// the kernel package version, the root file system's key and content hash,
// and the agent binary's hash. Building the same inputs again returns the
// existing image in milliseconds. The slow parts are cached one layer down,
// each keyed only by what shapes it:
//
//	DataDir/cache/kernel/<pkgversion>/    vmlinuz, modules/*.ko, kernel.json
//	DataDir/cache/kernel/current          the package version FetchKernel uses
//	DataDir/cache/debs/<name>_<ver>.deb   downloaded packages (busybox-static)
//	DataDir/cache/rootfs/<key>/           rootfs.ext4, rootfs.json
//	DataDir/cache/layers/sha256/<hex>     OCI layer blobs (recipe from; internal/ociimage),
//	                                      and build steps' layers (uncompressed tars), each
//	                                      image's in its manifest (from.layers, steps[].layer);
//	                                      forkd system prune removes those no image lists
//	DataDir/cache/steps/<key>.json        build step key -> the layer it made (steps.go)
//	DataDir/images/<digest>/              vmlinuz, initrd.img, rootfs.ext4, image.json
//
// The rootfs key is recipe.RootfsKey (base, packages, omit, from) plus the
// Debian release and architecture, and for a recipe with from the digest of
// the image manifest its reference resolved to (resolved on every build, so
// a tag that moved is a new root file system and a new image), and for a
// recipe with build steps the key of the last step (steps.go). Editing
// warm-up code, memory size or the agent produces a new image in about a
// second without rebuilding the root file system. Image files are hard links to the cached kernel and root file
// system where possible: cached files are never modified in place.
//
// # Crash and concurrency safety
//
// Every directory is assembled in a ".staging-<pid>-*" sibling, fsynced and
// renamed into place; image.json is written last. Builds of one digest (and of
// one rootfs key, and kernel fetches) are serialized by flock, so concurrent
// builds of a recipe produce one image and neither sees a partial one.
//
// # Host requirements
//
// A Debian host with apt package lists (apt-get update), dpkg, e2fsprogs
// (mkfs.ext4 -d), and for base = "debian" mmdebstrap and root (a recipe's
// omit list also needs dpkg-deb and mmdebstrap's file-mirror-automount hook:
// placeholders come from a flat repository in the staging dir). Missing tools
// are reported with the Debian package that provides them.
package image

// formatVersion is the builder's output format. Bump it whenever the layout
// of an image, its initramfs or its root file system changes in a way the
// agent or the VMM can see, so that old cached images are not reused.
const formatVersion = 1
