// Package ociimage pulls OCI and Docker images from registries and unpacks their
// layers into a directory tree, for the image builder (internal/image) to
// turn into a guest root file system.
//
// # Pulling
//
// A Puller resolves a reference (registry/repo:tag or @sha256:...) with
// google/go-containerregistry, with credentials from the usual docker
// config (authn.DefaultKeychain). A manifest list yields the entry for
// linux/GOARCH; when there is none, the error names the platforms it has.
// Plain-HTTP registries and ones with untrusted certificates are refused
// unless the Puller is Insecure: go-containerregistry itself falls back to
// HTTP for loopback and private addresses, which this package does not
// allow unasked.
//
// # The layer cache
//
// Layer blobs are kept as pulled (compressed) in CacheDir/sha256/<hex>,
// named by their digest and shared by every image that has them. A blob is
// downloaded into a ".partial-<pid>-*" file, checked against its declared
// size and digest, fsynced and renamed into place, so a crash or a corrupt
// download never leaves a file under a digest's name.
//
// Pulls hold the cache shared; Cache.Remove (forkd system prune) takes it
// exclusively, so a layer being fetched or applied is never removed (see
// cachedir.go).
//
// # Unpacking
//
// Layers are applied in order with the OCI whiteout rules (".wh.NAME"
// removes NAME, ".wh..wh..opq" empties a directory of lower layers'
// entries). Every path is resolved inside the tree, component by
// component, so symlinks act as in a chroot of the image: entries that climb
// with "..", or that write through a symlink leading above the root, are
// refused. Totals are bounded (Limits), each entry's declared size is
// checked before it is read, and each layer's uncompressed content is
// checked against the image config's diff ID. Device nodes are skipped (the
// guest has devtmpfs on /dev); ownership, modes, extended attributes and
// times are kept when running as root.
package ociimage
