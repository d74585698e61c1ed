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
	// Force replaces an existing snapshot with the same tag, atomically.
	Force bool
	// VerifyKey, if set, makes Unpack refuse an archive that is not signed
	// by this key.
	VerifyKey ed25519.PublicKey
	// Tag, if set, is the tag to create instead of the archive's.
	Tag string
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
	// ReplacedID is the ID of the snapshot a forced unpack replaced.
	ReplacedID string
	Duration   time.Duration
}

type unpacker struct {
	ctx      context.Context
	opts     UnpackOptions
	stats    UnpackStats
	snapRoot string
	imgRoot  string

	m    *Manifest
	head *Snapshot
	tag  string

	snapStage string
	imgStages map[string]string // digest → staging dir, for images not here yet
	dest      map[string]string // archive path → file to write; absent: verify only
	modes     map[string]os.FileMode
	external  map[string]bool  // files of images packed without their bytes
	sources   map[int]*os.File // copy sources opened so far, by file index
	published []string         // image directories this call created
	committed bool
}

// Unpack reads an archive from r into dataDir and publishes its snapshot
// under its tag (or opts.Tag). It reads r as hostile: see the package
// documentation. Everything is verified in staging directories before the
// tag appears; on any error nothing is left. A tag that exists is
// AlreadyExists unless opts.Force; a malformed, altered or unsigned-but-
// required archive is InvalidArgument.
func Unpack(ctx context.Context, dataDir string, r io.Reader, opts UnpackOptions) (snap *snapshot.Snapshot, stats UnpackStats, err error) {
	start := time.Now()
	if opts.MaxLogicalBytes <= 0 {
		opts.MaxLogicalBytes = DefaultMaxLogicalBytes
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.Tag != "" {
		if err := snapshot.ValidateTag(opts.Tag); err != nil {
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
		imgStages: map[string]string{}, dest: map[string]string{}, modes: map[string]os.FileMode{},
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
	if err := u.publishImages(); err != nil {
		return nil, stats, err
	}
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
	u.m = m
	return nil
}

// prepare checks the manifest against the limits and this host (tag,
// images, disk space) and creates the staging directories.
func (u *unpacker) prepare() error {
	m := u.m
	if len(m.Snapshots) != 1 {
		return fmt.Errorf("archive holds a chain of %d snapshots; this forkd unpacks single snapshots: %w", len(m.Snapshots), errdefs.ErrNotImplemented)
	}
	u.head = &m.Snapshots[len(m.Snapshots)-1]
	u.tag = u.head.Manifest.Tag
	if u.opts.Tag != "" {
		u.tag = u.opts.Tag
	}
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
	final := filepath.Join(u.snapRoot, u.tag)
	if _, err := os.Lstat(final); err == nil && !u.opts.Force {
		return u.exists()
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
	dir, err := os.MkdirTemp(u.snapRoot, ".staging-"+u.tag+"-")
	if err != nil {
		return err
	}
	u.snapStage = dir
	for name := range u.head.Manifest.Files {
		p := snapshotFilePath(u.head.ID, name)
		u.dest[p] = filepath.Join(dir, name)
		u.modes[p] = 0o400
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
// directory, or a file of an image already on this host.
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
