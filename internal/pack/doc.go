// Package pack moves snapshots between hosts as one portable archive: Pack
// writes a snapshot, the image it boots from and a manifest of every file
// into a zstd-compressed tar stream; Unpack verifies such a stream into
// staging directories and publishes the snapshot under a tag atomically.
// A layer (a diff branch, see package snapshot) travels with its whole
// chain: one archive holds the head and every ancestor down to its root.
//
// # Format (versions 1 and 2)
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
// digest, each once) and the snapshots, each with the snapshot manifest
// whose image paths are rewritten to archive paths, and every file: its archive path
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
// Version 1 holds one self-contained snapshot. Version 2 holds a chain,
// root first: Snapshots[0] stands alone (depth 0), each later snapshot is
// a layer on the one before it (its archive parent is that snapshot's
// archive ID, and its manifest's parent names it by tag and by content
// digest, one level deeper, with memory, memory.index and the root's
// memory size), and the head, the snapshot packed, is last. Files follow
// the same order: the images' first, then each snapshot's, root first, so
// a layer's pages can be stored as copies of its ancestors'. Pack writes
// version 1 whenever the snapshot stands alone, so that a forkd that
// reads only version 1 still unpacks it; Unpack reads both. The chain's
// digests are checked when the manifest is parsed (before any byte is
// written: a digest depends only on the files' hashes, which every byte
// is then checked against) and again once every byte was hashed.
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
// # Chains on the receiving host
//
// Unpack gives the head its tag (or UnpackOptions.Tag) and each ancestor
// the tag it had. An ancestor whose tag is here with the same content
// digest is reused: its bytes in the archive are verified, not written,
// and copies read from the files here. One whose tag is here with another
// digest is AlreadyExists, naming both digests, unless Force replaces it;
// a taken head tag is AlreadyExists unless Force, as for a flat snapshot.
// Force never breaks a local chain: replacing a snapshot with other
// content that local layers are built on is FailedPrecondition (naming
// them), unless the same archive replaces those layers too. Snapshots are
// committed root first (old layers replaced along with their parent are
// moved aside first, deepest first), so a crash leaves complete ancestors
// at most, never a layer without its parent; what was replaced is removed
// only once the whole chain is in place, and a failure removes what the
// unpack added and puts back what it replaced.
//
// # Hostile input
//
// Unpack trusts nothing in the stream: entries must be regular files whose
// names are exactly those the manifest implies, in order; links, devices,
// directories, tar-level sparse files and unlisted entries are refused; the
// manifest is bounded, its names follow the tag and digest rules, sizes
// are bounded by UnpackOptions, free disk space is checked before writing,
// every byte is hashed, copies read only from files already verified or
// from images and reused snapshots already on the host, a chain must hold
// together by digest and its layers' page indexes must decode, and
// everything is written into staging directories under the data directory
// that are removed on any error.
//
// Image digests cover a build's inputs, not its bytes; an unpacked image
// is trusted to be what its digest says, and a later build of the same
// recipe on this host will reuse it. Verify signatures (UnpackOptions.
// VerifyKey) of archives from sources you do not control.
package pack
