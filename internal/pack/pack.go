package pack

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// PackOptions tunes Pack.
type PackOptions struct {
	// SignKey, if set, signs the archive's manifest.
	SignKey ed25519.PrivateKey
	// Concurrency is how many files are hashed at once and how many
	// goroutines compress; 0 means GOMAXPROCS.
	Concurrency int
	// ExcludeImages leaves the images' bytes out: the archive still lists
	// them by digest and file hashes, and Unpack needs them on the
	// receiving host already (from another archive of the same image).
	ExcludeImages bool
}

// PackStats describes a written archive. Files of images left out
// (ExcludeImages) are not counted.
type PackStats struct {
	Files        int
	LogicalBytes int64 // sum of the files' sizes
	StoredBytes  int64 // file bytes in the tar stream: holes and zero runs are left out
	ArchiveBytes int64 // bytes written
	Signed       bool
	// Snapshots are the tags packed, root first: the snapshot asked for
	// is last, after the ancestors a layer needs.
	Snapshots []string
	// CopiedBytes are pages stored as copies of other pages (of the image's
	// root file system, mostly): not in StoredBytes.
	CopiedBytes int64
	// ScanDuration is the time spent mapping and hashing the files, before
	// the first byte was written.
	ScanDuration time.Duration
	Duration     time.Duration
}

// encoderLevel is zstd's fastest level: memory images are mostly zero
// pages and page-sized structures it compresses well even so, and the
// slower levels gain about a tenth in size at half the speed.
const encoderLevel = zstd.SpeedFastest

// source is one file Pack reads.
type source struct {
	File
	disk     string
	mode     int64
	f        *os.File
	phase    int  // scan phase: 0 for the images' files, 1+i for those of Snapshots[i]
	external bool // listed, but not stored (ExcludeImages)
}

// Pack writes the snapshot tagged tag, with the image it boots, to w as an
// archive. A layer is packed with its whole chain: every ancestor down to
// the root, root first, each with its files, and each image once. Every
// file is hashed against the hash recorded when it was created before
// anything is written, so a snapshot that changed on disk, or a chain
// whose ancestor is gone or was replaced, fails with FailedPrecondition
// and no output. An error after the first byte leaves a partial archive,
// which Unpack refuses.
func Pack(ctx context.Context, dataDir, tag string, w io.Writer, opts PackOptions) (stats PackStats, err error) {
	start := time.Now()
	conc := opts.Concurrency
	if conc <= 0 {
		conc = runtime.GOMAXPROCS(0)
	}
	chain, err := readChain(dataDir, tag)
	if err != nil {
		return stats, err
	}
	m, srcs, err := plan(dataDir, chain, opts.ExcludeImages)
	if err != nil {
		return stats, err
	}
	for _, s := range chain {
		stats.Snapshots = append(stats.Snapshots, s.Tag)
	}
	defer func() {
		for _, s := range srcs {
			if s.f != nil {
				s.f.Close()
			}
		}
	}()
	if err := scanAll(ctx, srcs, conc); err != nil {
		return stats, err
	}
	for _, s := range srcs {
		if s.external {
			s.Extents, s.Copies = nil, nil
			m.Files = append(m.Files, s.File)
			continue // listed, not carried: not counted
		}
		m.Files = append(m.Files, s.File)
		stats.Files++
		stats.LogicalBytes += s.Size
		stats.StoredBytes += s.Stored()
		for _, c := range s.Copies {
			stats.CopiedBytes += c.Len()
		}
	}
	stats.ScanDuration = time.Since(start)
	data, err := json.Marshal(m)
	if err != nil {
		return stats, err
	}
	if len(data) > maxManifestBytes {
		return stats, fmt.Errorf("snapshot %q: archive manifest would be %d bytes, over the %d Unpack accepts: %w", tag, len(data), maxManifestBytes, errdefs.ErrFailedPrecondition)
	}
	manifestFrame, err := entryFrame(ManifestName, data, m.Created)
	if err != nil {
		return stats, err
	}
	var sigFrame []byte
	if opts.SignKey != nil {
		sig, err := signManifest(opts.SignKey, data)
		if err != nil {
			return stats, err
		}
		if sigFrame, err = entryFrame(SignatureName, sig, m.Created); err != nil {
			return stats, err
		}
		stats.Signed = true
	}
	cw := &countingWriter{w: w}
	defer func() { stats.ArchiveBytes = cw.n; stats.Duration = time.Since(start) }()
	hdr := frameHeader{manifestLen: uint64(len(manifestFrame)), signatureLen: uint64(len(sigFrame))}
	for _, b := range [][]byte{hdr.marshal(), manifestFrame, sigFrame} {
		if _, err := cw.Write(b); err != nil {
			return stats, err
		}
	}
	enc, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(encoderLevel), zstd.WithEncoderConcurrency(conc), zstd.WithConcurrentBlocks(conc > 1))
	if err != nil {
		return stats, err
	}
	defer enc.Close() // after an error: stops its goroutines
	tw := tar.NewWriter(enc)
	buf := make([]byte, chunkSize)
	for _, s := range srcs {
		if s.external {
			continue
		}
		if err := writeFile(ctx, tw, s, buf, m.Created); err != nil {
			return stats, err
		}
	}
	if err := tw.Close(); err != nil {
		return stats, err
	}
	if err := enc.Close(); err != nil {
		return stats, err
	}
	return stats, nil
}

// readChain reads the snapshot tagged tag and, for a layer, its
// ancestors, and returns them root first (the head last). Each parent must
// be the very snapshot the layer was taken on (Store.Chain's rule): a
// missing or replaced ancestor is FailedPrecondition.
func readChain(dataDir, tag string) ([]*snapshot.Snapshot, error) {
	head, err := readSnapshot(dataDir, tag)
	if err != nil {
		return nil, err
	}
	chain := []*snapshot.Snapshot{head}
	for cur := head; cur.Parent != nil; {
		if len(chain) > snapshot.MaxChainDepth {
			return nil, fmt.Errorf("snapshot %q: chain deeper than %d layers: %w", tag, snapshot.MaxChainDepth, errdefs.ErrFailedPrecondition)
		}
		p, err := readSnapshot(dataDir, cur.Parent.Tag)
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("snapshot %q is a layer on %q (%s), which is gone: its chain cannot be packed: %w",
				cur.Tag, cur.Parent.Tag, cur.Parent.Digest, errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot %q: ancestor %q: %w", tag, cur.Parent.Tag, err)
		}
		if d := p.Digest(); d != cur.Parent.Digest {
			return nil, fmt.Errorf("snapshot %q is a layer on %q with digest %s, but %q now has %s (replaced or altered): its chain cannot be packed: %w",
				cur.Tag, cur.Parent.Tag, cur.Parent.Digest, p.Tag, d, errdefs.ErrFailedPrecondition)
		}
		chain = append(chain, p)
		cur = p
	}
	slices.Reverse(chain)
	return chain, nil
}

// readSnapshot reads a committed snapshot's manifest without opening the
// store: snapshot.Open also removes staging directories, which must not
// happen under a running daemon.
func readSnapshot(dataDir, tag string) (*snapshot.Snapshot, error) {
	if err := snapshot.ValidateTag(tag); err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, snapshotsDir, tag)
	data, err := os.ReadFile(filepath.Join(dir, snapshot.ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no snapshot tagged %q: %w", tag, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: %w", tag, err)
	}
	var m snapshot.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("snapshot %q: manifest is corrupt (%v): %w", tag, err, errdefs.ErrFailedPrecondition)
	}
	if m.FormatVersion < 1 || m.FormatVersion > snapshot.FormatVersion {
		return nil, fmt.Errorf("snapshot %q has manifest format %d, this forkd reads up to %d: %w", tag, m.FormatVersion, snapshot.FormatVersion, errdefs.ErrFailedPrecondition)
	}
	return &snapshot.Snapshot{Manifest: m, Dir: dir}, nil
}

// plan lists the files of the chain (root first) and of its images and
// builds the manifest around them (without the files' extents, which
// scanAll maps): the images' files first, each image once, then each
// snapshot's, root first.
func plan(dataDir string, chain []*snapshot.Snapshot, excludeImages bool) (*Manifest, []*source, error) {
	head := chain[len(chain)-1]
	version := FormatVersion
	if len(chain) == 1 {
		version = flatFormat // readable by every forkd that unpacks archives
	}
	m := &Manifest{
		FormatVersion: version,
		Created:       time.Now().UTC().Truncate(time.Second),
		Head:          head.ID,
	}
	var srcs []*source
	add := func(dir string, files map[string]snapshot.FileEntry, archivePath func(string) string, mode int64, phase int, external bool) {
		names := make([]string, 0, len(files))
		for n := range files {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			srcs = append(srcs, &source{
				File: File{Path: archivePath(n), Size: files[n].Size, SHA256: files[n].SHA256},
				disk: filepath.Join(dir, n), mode: mode, phase: phase, external: external,
			})
		}
	}
	images := map[string]*imageManifest{}
	for _, snap := range chain {
		digest := snap.Image.Digest
		if images[digest] != nil {
			continue
		}
		if !digestPattern.MatchString(digest) {
			return nil, nil, fmt.Errorf("snapshot %q records image digest %q: %w", snap.Tag, digest, errdefs.ErrFailedPrecondition)
		}
		imgDir := filepath.Join(dataDir, imagesDir, digest)
		raw, err := os.ReadFile(filepath.Join(imgDir, imageManifestName))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("snapshot %q boots image %s, which is no longer in %s: %w", snap.Tag, digest[:12], filepath.Join(dataDir, imagesDir), errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, nil, err
		}
		im, err := parseImageManifest(raw)
		if err != nil || im.Digest != digest {
			return nil, nil, fmt.Errorf("image %s: cannot pack its image.json (%v): %w", digest[:12], err, errdefs.ErrFailedPrecondition)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			return nil, nil, err
		}
		images[digest] = im
		m.Images = append(m.Images, Image{Digest: digest, Manifest: compact.Bytes(), External: excludeImages})
		add(imgDir, im.Files, func(n string) string { return imageFilePath(digest, n) }, 0o444, 0, excludeImages)
	}
	for i, snap := range chain {
		digest := snap.Image.Digest
		sm := snap.Manifest
		for _, p := range []*string{&sm.Image.Kernel, &sm.Image.Initrd, &sm.Image.Rootfs} {
			if *p == "" {
				continue
			}
			name := filepath.Base(*p)
			if _, ok := images[digest].Files[name]; !ok {
				return nil, nil, fmt.Errorf("snapshot %q boots %s, which is not a file of image %s: %w", snap.Tag, *p, digest[:12], errdefs.ErrFailedPrecondition)
			}
			*p = imageFilePath(digest, name)
		}
		if !idPattern.MatchString(sm.ID) {
			return nil, nil, fmt.Errorf("snapshot %q has id %q: %w", snap.Tag, sm.ID, errdefs.ErrFailedPrecondition)
		}
		for n := range sm.Files {
			if !validName(n, snapshot.ManifestFile) {
				return nil, nil, fmt.Errorf("snapshot %q has a file named %q: %w", snap.Tag, n, errdefs.ErrFailedPrecondition)
			}
		}
		as := Snapshot{ID: sm.ID, Manifest: sm}
		if i > 0 {
			as.Parent = chain[i-1].ID
		}
		m.Snapshots = append(m.Snapshots, as)
		add(snap.Dir, sm.Files, func(n string) string { return snapshotFilePath(sm.ID, n) }, 0o400, 1+i, false)
	}
	if err := m.checkWith(srcs); err != nil {
		return nil, nil, fmt.Errorf("snapshot %q: %v: %w", head.Tag, err, errdefs.ErrFailedPrecondition)
	}
	return m, srcs, nil
}

// checkWith runs the manifest check Unpack will run, with placeholder
// extents, so Pack never writes an archive Unpack refuses for its layout.
func (m *Manifest) checkWith(srcs []*source) error {
	c := *m
	c.Files = nil
	for _, s := range srcs {
		c.Files = append(c.Files, File{Path: s.Path, Size: s.Size, SHA256: s.SHA256})
	}
	return c.check()
}

// scanAll opens, maps and hashes the files, and fails if one no longer
// matches its recorded size and hash. The images' files come first, conc
// at a time, biggest first; then each snapshot's, root first, each
// deduplicated against the pages of every file scanned before it.
func scanAll(ctx context.Context, srcs []*source, conc int) error {
	files := make([]*os.File, len(srcs))
	for i, s := range srcs {
		if err := s.open(); err != nil {
			return err
		}
		files[i] = s.f
	}
	sc := newScanner(files)
	var phases [][]int
	for i, s := range srcs {
		for len(phases) <= s.phase {
			phases = append(phases, nil)
		}
		phases[s.phase] = append(phases[s.phase], i)
	}
	maps := make([]*mapping, len(srcs))
	for _, phase := range phases {
		if err := parallel(ctx, phase, conc, func(ctx context.Context, i int) error {
			s := srcs[i]
			m, err := sc.scan(ctx, i, s.Size)
			if err != nil {
				return err
			}
			if m.sha256 != s.SHA256 {
				return fmt.Errorf("%s changed since it was created (sha256 %s, recorded %s): %w", s.disk, m.sha256, s.SHA256, errdefs.ErrFailedPrecondition)
			}
			s.Extents, s.Copies = m.extents, m.copies
			maps[i] = m
			return nil
		}, func(i int) int64 { return srcs[i].Size }); err != nil {
			return err
		}
		for _, i := range phase {
			sc.learn(i, maps[i].pages)
			maps[i] = nil
		}
	}
	return nil
}

// parallel runs fn for each index, conc at a time, biggest first; the
// first error cancels the rest.
func parallel(ctx context.Context, idxs []int, conc int, fn func(context.Context, int) error, size func(int) int64) error {
	order := append([]int(nil), idxs...)
	sort.SliceStable(order, func(a, b int) bool { return size(order[a]) > size(order[b]) })
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for _, i := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}

// open opens the file and checks its size against the recorded one.
func (s *source) open() error {
	f, err := os.Open(s.disk)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s is missing: %w", s.disk, errdefs.ErrFailedPrecondition)
		}
		return err
	}
	s.f = f
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != s.Size {
		return fmt.Errorf("%s changed since it was created (%d bytes, recorded %d): %w", s.disk, fi.Size(), s.Size, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// writeFile writes one file's tar entry: its extents, concatenated.
func writeFile(ctx context.Context, tw *tar.Writer, s *source, buf []byte, mtime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: s.Path, Size: s.Stored(), Mode: s.mode, ModTime: mtime}); err != nil {
		return err
	}
	for _, e := range s.Extents {
		for off := e.Off(); off < e.End(); {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := int(min(int64(len(buf)), e.End()-off))
			if _, err := s.f.ReadAt(buf[:n], off); err != nil {
				return fmt.Errorf("read %s: %w", s.disk, err)
			}
			if _, err := tw.Write(buf[:n]); err != nil {
				return err
			}
			off += int64(n)
		}
	}
	return nil
}

// entryFrame returns one tar entry (without the trailer) as a zstd frame.
func entryFrame(name string, data []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: 0o444, ModTime: mtime}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	return enc.EncodeAll(buf.Bytes(), nil), nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
