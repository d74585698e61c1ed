// Package pack moves snapshots between hosts as one portable archive: Pack
// writes a snapshot, the image it boots from and a manifest of every file
// into a zstd-compressed tar stream; Unpack verifies such a stream into
// staging directories and publishes the snapshot under a tag atomically.
//
// # Format (version 1)
//
// An archive is a zstd stream of one or more frames whose decompressed
// bytes are a POSIX tar stream:
//
//	zstd skippable frame   "FORKDAR1", manifest frame length, signature frame length
//	zstd frame 1           tar entry forkd-archive.json (the manifest)
//	zstd frame 2, if signed  tar entry forkd-archive.sig
//	zstd frame 3           one tar entry per file, in manifest order, then the tar trailer
//
// Standard tools read it (`zstd -dc A | tar t`): decoders skip the
// skippable frame and concatenate the others. The frame split exists so
// that Sign can add a signature to an archive without decompressing it.
//
// The manifest comes first, so Unpack knows every name, size and hash
// before it writes a byte. It lists the images (image.json verbatim, by
// digest) and the snapshots in dependency order (one today; a chain of
// parents later), each with the snapshot manifest whose image paths are
// rewritten to archive paths, and every file: its archive path
// (images/<digest>/<name> or snapshots/<id>/<name>), logical size,
// SHA-256 of the logical content, extents and copies. Extents are the byte
// ranges stored in the archive; a file's tar entry holds exactly their
// bytes, concatenated. Copies are page ranges equal to a range of an
// earlier file (or an earlier part of the same file): the guest's page
// cache repeats its root file system block for block, so a memory image
// shrinks by a third when those pages are references. Everything neither
// stored nor copied reads as zeros: holes of sparse files and runs of zero
// pages are not stored, and Unpack recreates them as holes.
//
// An image can be listed without its bytes (PackOptions.ExcludeImages):
// Unpack then requires an image with that digest and the same file hashes
// on the receiving host, and copies read from it there.
//
// Hashes come from the snapshot manifest and image.json, which recorded
// them at creation. Pack re-hashes every file while it maps its extents
// and fails if one changed, so the manifest it writes is true.
//
// # Signing
//
// A signature is an ed25519 signature of the manifest bytes (prefixed with
// a context string), carried in forkd-archive.sig. Since Unpack checks
// every byte of every file against the manifest's hashes, a valid
// signature covers the whole archive. Pack signs when given a key; Sign
// adds or replaces the signature of an existing archive stream, which is
// how the CLI signs an archive the daemon made without sending the private
// key anywhere.
//
// # Hostile input
//
// Unpack trusts nothing in the stream: entries must be regular files whose
// names are exactly those the manifest implies, in order; links, devices,
// directories, tar-level sparse files and unlisted entries are refused; the
// manifest is bounded, its names follow the tag and digest rules, sizes
// are bounded by UnpackOptions, free disk space is checked before writing,
// every byte is hashed, copies read only from files already verified or
// from images already on the host, and everything is written into staging
// directories under the data directory that are removed on any error.
//
// Image digests cover a build's inputs, not its bytes; an unpacked image
// is trusted to be what its digest says, and a later build of the same
// recipe on this host will reuse it. Verify signatures (UnpackOptions.
// VerifyKey) of archives from sources you do not control.
package pack
