package pack

import (
	"archive/tar"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// Defaults of UnpackOptions.
const (
	DefaultMaxLogicalBytes = 64 << 30
	DefaultMaxFiles        = 64
)

const (
	// maxWindow bounds the decoder's memory; Pack's encoder uses 8 MiB at most.
	maxWindow = 64 << 20
	// freeMargin is the disk space Unpack leaves free beyond what it writes.
	freeMargin = 64 << 20
	// maxTrailing is how many zero bytes may follow the tar trailer (tar
	// tools pad archives to their record size).
	maxTrailing = 1 << 20
)

// UnpackOptions tunes Unpack.
type UnpackOptions struct {
	// Force replaces an existing snapshot with the same tag, atomically,
	// and an ancestor of the archive's chain that exists here under its
	// tag with other content. A snapshot with local layers on it is
	// replaced only if this unpack replaces those layers too; see Unpack.
	Force bool
	// VerifyKey, if set, makes Unpack refuse an archive that is not signed
	// by this key.
	VerifyKey ed25519.PublicKey
	// TrustedKeys, if any, is the daemon's import policy: Unpack refuses
	// (errdefs.ErrPermissionDenied) an archive not signed by one of them,
	// whatever VerifyKey says.
	TrustedKeys []ed25519.PublicKey
	// Tag, if set, is the tag to create instead of the archive's head's;
	// ancestors keep their tags.
	Tag string
	// ReservedTag lets Tag be in snapshot.ReservedTagPrefix's namespace:
	// set by the daemon's fork by registry reference alone, never from a
	// request. Whatever it says, no other snapshot of the archive is
	// created under a reserved tag (an ancestor already here with the
	// same digest is reused).
	ReservedTag bool
	// ReplaceHead replaces the snapshot under the head's tag, as Force
	// does, but no ancestor: those must be absent or the same here.
	ReplaceHead bool
	// MaxLogicalBytes bounds the sum of the files' sizes (holes included);
	// 0 means DefaultMaxLogicalBytes.
	MaxLogicalBytes int64
	// MaxFiles bounds the number of files; 0 means DefaultMaxFiles.
	MaxFiles int64
}

// UnpackStats describes an unpacked archive.
type UnpackStats struct {
	Files        int
	LogicalBytes int64
	StoredBytes  int64 // file bytes read from the tar stream
	ArchiveBytes int64 // compressed bytes read
	// Signed: the archive carries a signature. Verified: it was checked
	// against UnpackOptions.VerifyKey.
	Signed, Verified bool
	// ImagesAdded and ImagesReused are image digests; a reused image was
	// already here with the same files, so its bytes were only verified.
	ImagesAdded, ImagesReused []string
	// Added are the tags of the snapshots this unpack created, Reused
	// those of the ancestors that were here already with the same content
	// digest (verified against the archive, not written), Replaced those
	// a forced unpack replaced; each root first.
	Added, Reused, Replaced []string
	// ReplacedID is the ID of the head snapshot a forced unpack replaced;
	// ReplacedIDs are the IDs of every snapshot it replaced (the head's
	// included), whose pooled VMMs are stale.
	ReplacedID  string
	ReplacedIDs []string
	Duration    time.Duration
}

// testHookCommit, if set, runs before each snapshot of the chain is
// committed; an error fails the unpack there (tests of rollback).
var testHookCommit func(tag string) error

// Actions on each snapshot of an archive.
const (
	actAdd     = iota // the tag is free: create it
	actReuse          // an ancestor that is here with the same digest: verify only
	actReplace        // the tag is taken and Force is set: replace it
)

// unpackSnap is one snapshot of the archive and what Unpack does with it.
type unpackSnap struct {
	s      *Snapshot
	tag    string // on this host: the archive's, or UnpackOptions.Tag for the head
	digest string // content digest (the same here as where it was packed)
	head   bool
	action int
	// old is the snapshot here under tag (actReuse, actReplace), nil if
	// its manifest is unreadable; oldDigest is its digest.
	old       *snapshot.Snapshot
	oldDigest string
	// moveFirst: the old snapshot is a layer on another snapshot this
	// unpack replaces, so it is moved away before anything is committed.
	moveFirst bool
	stage     string // staging directory of the new snapshot
	// moved is where the old snapshot went (a .trash- or .staging-
	// directory), kept until the whole unpack succeeds, for rollback.
	moved     string
	committed bool // the new snapshot is under tag
	result    *snapshot.Snapshot
}

type unpacker struct {
	ctx      context.Context
	opts     UnpackOptions
	stats    UnpackStats
	snapRoot string
	imgRoot  string

	m     *Manifest
	raw   []byte        // the manifest's bytes, as signed
	sig   []byte        // the signature's, nil if unsigned
	snaps []*unpackSnap // root first, the head last
	tag   string        // the head's tag here

	imgStages map[string]string // digest → staging dir, for images not here yet
	dest      map[string]string // archive path → file to write; absent: verify only
	local     map[string]string // archive path → file of a reused snapshot here, for copies
	modes     map[string]os.FileMode
	external  map[string]bool  // files of images packed without their bytes
	sources   map[int]*os.File // copy sources opened so far, by file index
	published []string         // image directories this call created
	// commitStarted: commit has begun changing tags; rollback undoes it.
	commitStarted bool
}

// Unpack reads an archive from r into dataDir and publishes its snapshot
// under its tag (or opts.Tag), with the ancestors a layer needs under
// theirs. It reads r as hostile: see the package documentation.
// Everything is verified in staging directories before any tag appears;
// on any error nothing this call added is left, and what it replaced is
// put back.
//
// The head's tag must be free unless opts.Force (AlreadyExists). An
// ancestor whose tag is here with the same content digest is reused: its
// bytes in the archive are verified but not written. An ancestor whose
// tag is here with another digest is AlreadyExists, naming both digests,
// unless opts.Force replaces it. Force never breaks a chain: replacing a
// snapshot (with other content) that local layers are built on is
// FailedPrecondition, unless this unpack replaces those layers too.
// Snapshots are committed root first, so a crash leaves complete
// ancestors at most, never a layer without its parent. A malformed,
// altered, broken-chain or unsigned-but-required archive is
// InvalidArgument.
func Unpack(ctx context.Context, dataDir string, r io.Reader, opts UnpackOptions) (snap *snapshot.Snapshot, stats UnpackStats, err error) {
	start := time.Now()
	if opts.MaxLogicalBytes <= 0 {
		opts.MaxLogicalBytes = DefaultMaxLogicalBytes
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.Tag != "" {
		check := snapshot.ValidateNewTag
		if opts.ReservedTag {
			check = snapshot.ValidateTag
		}
		if err := check(opts.Tag); err != nil {
			return nil, stats, err
		}
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, stats, err
	}
	u := &unpacker{
		ctx: ctx, opts: opts,
		snapRoot:  filepath.Join(abs, snapshotsDir),
		imgRoot:   filepath.Join(abs, imagesDir),
		imgStages: map[string]string{}, dest: map[string]string{}, local: map[string]string{}, modes: map[string]os.FileMode{},
		external: map[string]bool{}, sources: map[int]*os.File{},
	}
	defer u.closeSources()
	defer func() {
		if err != nil {
			u.rollback()
		}
		u.stats.Duration = time.Since(start)
		stats = u.stats
	}()
	limit := opts.MaxLogicalBytes + opts.MaxLogicalBytes>>10 + 2*maxManifestBytes
	if limit < opts.MaxLogicalBytes { // overflowed
		limit = math.MaxInt64
	}
	cr := &limitedReader{r: r, limit: limit}
	defer func() { u.stats.ArchiveBytes = cr.n }()
	zr, err := zstd.NewReader(cr, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderConcurrency(2))
	if err != nil {
		return nil, stats, err
	}
	defer zr.Close()
	st := &stream{tr: tar.NewReader(zr)}
	if err := u.readManifest(st); err != nil {
		return nil, stats, err
	}
	if err := u.prepare(); err != nil {
		return nil, stats, err
	}
	buf := make([]byte, chunkSize)
	for i := range u.m.Files {
		f := &u.m.Files[i]
		if u.external[f.Path] {
			continue
		}
		hdr, err := st.next(f.Path)
		if errors.Is(err, io.EOF) {
			return nil, stats, invalid("archive ends before %s (truncated?)", f.Path)
		}
		if err != nil {
			return nil, stats, err
		}
		if err := checkEntry(hdr, f.Path, f.Stored()); err != nil {
			return nil, stats, err
		}
		if err := u.extract(st.tr, i, buf); err != nil {
			return nil, stats, err
		}
	}
	if err := finish(st, zr); err != nil {
		return nil, stats, err
	}
	if err := u.checkLayers(); err != nil {
		return nil, stats, err
	}
	if err := u.publishImages(); err != nil {
		return nil, stats, err
	}
	// The ancestors the archive reuses must not be removed while the
	// layers on them are renamed into place.
	unlock, err := snapshot.LockChains(ctx, u.snapRoot)
	if err != nil {
		return nil, stats, err
	}
	defer unlock()
	snap, err = u.commit()
	return snap, stats, err
}

// readManifest reads the manifest and the optional signature entry,
// verifies the signature if asked, and checks the manifest.
func (u *unpacker) readManifest(st *stream) error {
	hdr, err := st.next(ManifestName)
	if errors.Is(err, io.EOF) {
		return invalid("empty archive")
	}
	if err != nil {
		return err
	}
	if hdr.Name != ManifestName || hdr.Size > maxManifestBytes {
		return invalid("first entry is %q (%d bytes), want %s of at most %d bytes: not a forkd archive", hdr.Name, hdr.Size, ManifestName, maxManifestBytes)
	}
	if err := checkEntry(hdr, ManifestName, hdr.Size); err != nil {
		return err
	}
	data := make([]byte, hdr.Size)
	if _, err := io.ReadFull(st.tr, data); err != nil {
		return readErr(ManifestName, err)
	}
	var sig []byte
	hdr, err = st.next(SignatureName)
	switch {
	case err != nil && !errors.Is(err, io.EOF):
		return err
	case err == nil && hdr.Name == SignatureName:
		if err := checkEntry(hdr, SignatureName, hdr.Size); err != nil {
			return err
		}
		if hdr.Size > maxSignatureBytes {
			return invalid("%s is %d bytes, at most %d", SignatureName, hdr.Size, maxSignatureBytes)
		}
		sig = make([]byte, hdr.Size)
		if _, err := io.ReadFull(st.tr, sig); err != nil {
			return readErr(SignatureName, err)
		}
		u.stats.Signed = true
	default:
		st.unread(hdr, err) // the first file's entry, or the end
	}
	// Verify before parsing: with a key, nothing unsigned is interpreted.
	if len(u.opts.TrustedKeys) > 0 {
		if err := verifyTrusted(u.opts.TrustedKeys, data, sig); err != nil {
			return err
		}
		u.stats.Verified = true
	}
	if u.opts.VerifyKey != nil {
		if err := verifyManifest(u.opts.VerifyKey, data, sig); err != nil {
			return err
		}
		u.stats.Verified = true
	}
	m, err := parseManifest(data)
	if err != nil {
		return err
	}
	u.m, u.raw, u.sig = m, data, sig
	return nil
}

// prepare checks the manifest against the limits and this host (tags,
// images, disk space), decides what happens to each snapshot of the chain
// and creates the staging directories.
func (u *unpacker) prepare() error {
	m := u.m
	if int64(len(m.Files)) > u.opts.MaxFiles {
		return invalid("%d files, over the limit of %d", len(m.Files), u.opts.MaxFiles)
	}
	var logical int64
	for _, f := range m.Files {
		// Sizes are non-negative and each is at most the limit, so the sum
		// cannot overflow before the check trips.
		if f.Size > u.opts.MaxLogicalBytes || logical > u.opts.MaxLogicalBytes-f.Size {
			return invalid("files total over %d bytes (at %s, %d bytes): over the unpack size limit", u.opts.MaxLogicalBytes, f.Path, f.Size)
		}
		logical += f.Size
	}
	for i := range m.Snapshots {
		s := &m.Snapshots[i]
		us := &unpackSnap{s: s, tag: s.Manifest.Tag, digest: digestOf(&s.Manifest), head: i == len(m.Snapshots)-1}
		if us.head && u.opts.Tag != "" {
			for _, a := range m.Snapshots[:i] {
				if a.Manifest.Tag == u.opts.Tag {
					return fmt.Errorf("tag %q is the tag of an ancestor the archive's chain holds; choose another: %w", u.opts.Tag, errdefs.ErrInvalidArgument)
				}
			}
			us.tag = u.opts.Tag
		}
		u.snaps = append(u.snaps, us)
	}
	u.tag = u.snaps[len(u.snaps)-1].tag
	for _, us := range u.snaps {
		if err := u.classify(us); err != nil {
			return err
		}
		if err := u.checkReserved(us); err != nil {
			return err
		}
	}
	if err := u.checkDependents(); err != nil {
		return err
	}
	for _, d := range []struct {
		dir  string
		perm os.FileMode
	}{{u.snapRoot, 0o700}, {u.imgRoot, 0o755}} {
		if err := os.MkdirAll(d.dir, d.perm); err != nil {
			return err
		}
	}
	// Images already here are verified against the archive and reused.
	var write int64
	for _, img := range m.Images {
		local, err := u.localImage(img)
		if err != nil {
			return err
		}
		im, _ := parseImageManifest(img.Manifest)
		if img.External {
			if !local {
				return fmt.Errorf("archive was packed without image %s (recipe %s), which is not on this host: pack it again with its image, or unpack an archive that has it first: %w",
					img.Digest[:12], im.Recipe.Name, errdefs.ErrFailedPrecondition)
			}
			for name := range im.Files {
				u.external[imageFilePath(img.Digest, name)] = true
			}
		}
		if local {
			u.stats.ImagesReused = append(u.stats.ImagesReused, img.Digest)
			continue
		}
		dir, err := os.MkdirTemp(u.imgRoot, fmt.Sprintf(".staging-%d-", os.Getpid()))
		if err != nil {
			return err
		}
		u.imgStages[img.Digest] = dir
		for name := range im.Files {
			p := imageFilePath(img.Digest, name)
			u.dest[p] = filepath.Join(dir, name)
			u.modes[p] = 0o444
		}
	}
	for _, us := range u.snaps {
		if us.action == actReuse {
			// Verified from the archive, not written; later files may copy
			// pages from the copy here, which has the same hashes.
			for name := range us.s.Manifest.Files {
				u.local[snapshotFilePath(us.s.ID, name)] = filepath.Join(u.snapRoot, us.tag, name)
			}
			continue
		}
		dir, err := os.MkdirTemp(u.snapRoot, ".staging-"+us.tag+"-")
		if err != nil {
			return err
		}
		us.stage = dir
		for name := range us.s.Manifest.Files {
			p := snapshotFilePath(us.s.ID, name)
			u.dest[p] = filepath.Join(dir, name)
			u.modes[p] = 0o400
		}
	}
	for _, f := range m.Files {
		if _, ok := u.dest[f.Path]; ok {
			write += f.Stored()
			for _, c := range f.Copies {
				write += c.Len()
			}
		}
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(u.snapRoot, &sfs); err == nil {
		if free := int64(sfs.Bavail) * int64(sfs.Bsize); free < write+freeMargin {
			return fmt.Errorf("unpacking needs %d MiB of disk space in %s, %d MiB are free: %w", (write+freeMargin)>>20, u.snapRoot, free>>20, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// classify decides what happens to one snapshot of the chain given what
// is under its tag here: add it (free tag), reuse the one here (an
// ancestor with the same digest), or replace it (Force); otherwise the
// tag is AlreadyExists.
func (u *unpacker) classify(us *unpackSnap) error {
	us.action, us.old, us.oldDigest = actAdd, nil, ""
	final := filepath.Join(u.snapRoot, us.tag)
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	old, err := readSnapshot(filepath.Dir(u.snapRoot), us.tag)
	if err == nil {
		us.old, us.oldDigest = old, old.Digest()
	}
	if !us.head && us.oldDigest == us.digest {
		us.action = actReuse
		return nil
	}
	if !u.opts.Force && !(us.head && u.opts.ReplaceHead) {
		if us.head {
			return u.exists()
		}
		here := us.oldDigest
		if here == "" {
			here = fmt.Sprintf("unknown (%v)", err)
		}
		return fmt.Errorf("snapshot %q, an ancestor of %q in the archive, exists here with other content (digest %s here, %s in the archive): unpack with force to replace it, or remove it first: %w",
			us.tag, u.tag, here, us.digest, errdefs.ErrAlreadyExists)
	}
	us.action = actReplace
	return nil
}

// checkReserved refuses to create or replace a snapshot under a reserved
// tag (snapshot.ReservedTagPrefix) unless it is the head and the daemon
// asked for that tag (UnpackOptions.ReservedTag): an archive's tags are
// whatever its maker wrote.
func (u *unpacker) checkReserved(us *unpackSnap) error {
	if !snapshot.IsReservedTag(us.tag) || us.action == actReuse || (us.head && u.opts.ReservedTag && us.tag == u.opts.Tag) {
		return nil
	}
	if us.head {
		return fmt.Errorf("the archive's snapshot is tagged %q: %w (unpack or pull it with a tag of your own)", us.tag, snapshot.ReservedTagError(us.tag))
	}
	return fmt.Errorf("the archive's chain holds ancestor %q, which is not on this host as it is there: %w (pull or unpack that ancestor under a tag of your own, branch from it and push the branch again)",
		us.tag, snapshot.ReservedTagError(us.tag))
}

// checkDependents refuses to replace a snapshot that local layers are
// built on (they would name a parent digest that is gone) unless this
// unpack replaces those layers as well; it marks such replaced layers to
// be moved away before their parent is replaced. Replacing a snapshot
// with one of the same digest (a forced head) breaks nothing.
func (u *unpacker) checkDependents() error {
	replaced := map[string]*unpackSnap{} // tag → snapshot replaced with other content
	for _, us := range u.snaps {
		if us.action == actReplace && us.oldDigest != us.digest {
			replaced[us.tag] = us
		}
	}
	if len(replaced) == 0 {
		return nil
	}
	local, err := localSnapshots(u.snapRoot)
	if err != nil {
		return err
	}
	for _, tag := range sortedKeys(replaced) {
		us := replaced[tag]
		if us.oldDigest == "" {
			continue // unreadable here: nothing can name its digest
		}
		var blocked []string
		for _, l := range local {
			if l.Parent == nil || l.Parent.Tag != tag || l.Parent.Digest != us.oldDigest {
				continue
			}
			if r := replaced[l.Tag]; r != nil && r.oldDigest == digestOf(&l.Manifest) {
				r.moveFirst = true
				continue
			}
			blocked = append(blocked, l.Tag)
		}
		if len(blocked) > 0 {
			return fmt.Errorf("snapshot %q here has layers built on it (%s) that this archive does not replace; replacing %q would break their chains: remove them first (forkd rmi --cascade %s), or unpack without force: %w",
				tag, strings.Join(blocked, ", "), tag, tag, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// localSnapshots reads the manifests of the snapshots in snapRoot,
// skipping staging directories and unreadable ones.
func localSnapshots(snapRoot string) ([]*snapshot.Snapshot, error) {
	ents, err := os.ReadDir(snapRoot)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []*snapshot.Snapshot
	for _, e := range ents {
		if !e.IsDir() || snapshot.ValidateTag(e.Name()) != nil {
			continue
		}
		if s, err := readSnapshot(filepath.Dir(snapRoot), e.Name()); err == nil {
			out = append(out, s)
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (u *unpacker) exists() error {
	return fmt.Errorf("snapshot %q already exists; unpack with force to replace it or choose another tag: %w", u.tag, errdefs.ErrAlreadyExists)
}

// localImage reports whether img is already here, and fails if it is
// here with other files: a snapshot's memory holds the guest's view of its
// image, so it must boot the very same files.
func (u *unpacker) localImage(img Image) (bool, error) {
	raw, err := os.ReadFile(filepath.Join(u.imgRoot, img.Digest, imageManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	local, err := parseImageManifest(raw)
	if err != nil {
		return false, fmt.Errorf("image %s is here but unreadable (%v): %w", img.Digest[:12], err, errdefs.ErrFailedPrecondition)
	}
	want, _ := parseImageManifest(img.Manifest)
	for name, e := range want.Files {
		if l, ok := local.Files[name]; !ok || l != e {
			return false, fmt.Errorf("image %s is here with a different %s than the archive's (sha256 %s, archive %s): %w",
				img.Digest[:12], name, l.SHA256, e.SHA256, errdefs.ErrFailedPrecondition)
		}
	}
	return true, nil
}

// extract reads file idx's extents from r, fills in its copies, writes
// it to its staging file (or only verifies it, for a reused image) and
// checks its hash.
func (u *unpacker) extract(r io.Reader, idx int, buf []byte) (err error) {
	f := &u.m.Files[idx]
	var out *os.File
	if dst, ok := u.dest[f.Path]; ok {
		// Read-write: a copy may come from earlier in the file itself.
		out, err = os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		defer func() {
			if out != nil {
				out.Close()
			}
		}()
		// Holes are whatever the extents and copies do not cover.
		if err := out.Truncate(f.Size); err != nil {
			return err
		}
	}
	h := sha256.New()
	var pos int64
	err = f.segments(func(off, n int64, c *Copy) error {
		hashZeros(h, off-pos)
		var src *os.File
		if c != nil {
			if src, err = u.source(int(c.Src()), idx, out); err != nil {
				return err
			}
		}
		for done := int64(0); done < n; {
			if err := u.ctx.Err(); err != nil {
				return err
			}
			k := min(int64(len(buf)), n-done)
			if c == nil {
				if _, err := io.ReadFull(r, buf[:k]); err != nil {
					return readErr(f.Path, err)
				}
			} else if got, err := src.ReadAt(buf[:k], c.SrcOff()+done); int64(got) != k {
				return fmt.Errorf("%s: copy source %s is shorter than its manifest says (%v): %w", f.Path, src.Name(), err, errdefs.ErrFailedPrecondition)
			}
			h.Write(buf[:k])
			if out != nil {
				if _, err := out.WriteAt(buf[:k], off+done); err != nil {
					return err
				}
			}
			done += k
		}
		pos = off + n
		return nil
	})
	if err != nil {
		return err
	}
	hashZeros(h, f.Size-pos)
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		return invalid("%s: content has sha256 %s, the manifest says %s (corrupt or altered archive)", f.Path, sum, f.SHA256)
	}
	u.stats.Files++
	u.stats.LogicalBytes += f.Size
	u.stats.StoredBytes += f.Stored()
	if out == nil {
		return nil
	}
	if err := out.Chmod(u.modes[f.Path]); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	err = out.Close()
	out = nil
	return err
}

// source opens the file copies of file cur read from: cur itself (out,
// when it is being written), an earlier file of the archive in its staging
// directory, or a file of an image or of a reused snapshot already on this
// host (whose manifest records the hash the archive's bytes were just
// verified against; what is copied from it is hashed as part of the file
// being written in any case).
func (u *unpacker) source(i, cur int, out *os.File) (*os.File, error) {
	if i == cur && out != nil {
		return out, nil
	}
	if f := u.sources[i]; f != nil {
		return f, nil
	}
	p := u.m.Files[i].Path
	disk, ok := u.dest[p]
	if !ok {
		disk, ok = u.local[p]
	}
	if !ok {
		// Not written by this unpack: a file of a local image (the
		// manifest check allows copies only from listed files).
		rest, isImage := strings.CutPrefix(p, imagesDir+"/")
		if !isImage {
			return nil, invalid("copy from %s, which is not unpacked", p)
		}
		disk = filepath.Join(u.imgRoot, filepath.FromSlash(rest))
	}
	f, err := os.OpenFile(disk, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	u.sources[i] = f
	return f, nil
}

func (u *unpacker) closeSources() {
	for _, f := range u.sources {
		f.Close()
	}
}
