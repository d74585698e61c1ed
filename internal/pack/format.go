package pack

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// FormatVersion is the newest archive manifest format: version 2 holds a
// chain (a layer and its ancestors, root first); version 1 holds one
// self-contained snapshot. Pack writes version 1 whenever the snapshot
// stands alone, so that forkd releases that read only version 1 still
// unpack it. Unpack reads both and refuses newer versions.
const FormatVersion = 2

// flatFormat is the format of an archive of one self-contained snapshot.
const flatFormat = 1

// Names of the archive's first entries.
const (
	ManifestName  = "forkd-archive.json"
	SignatureName = "forkd-archive.sig"
)

// MediaType is what the API sends archives as: the outer layer is a plain
// zstd stream.
const MediaType = "application/zstd"

// Limits of the archive layout itself (UnpackOptions bounds the content).
const (
	maxManifestBytes  = 16 << 20
	maxSignatureBytes = 4 << 10
	maxExtentsPerFile = 1 << 20
	maxImages         = 16
	maxSnapshots      = 64
)

// Names inside the archive and on disk.
const (
	imageManifestName = "image.json" // in an image directory
	imagesDir         = "images"
	snapshotsDir      = "snapshots"
	imageFormat       = 1 // image.json format_version this forkd reads
)

// Manifest is forkd-archive.json.
type Manifest struct {
	FormatVersion int       `json:"format_version"`
	Created       time.Time `json:"created"`
	// Head is the archive ID of the snapshot the archive was made for: the
	// last of Snapshots.
	Head string `json:"head"`
	// Images the snapshots boot from, by digest, each once.
	Images []Image `json:"images"`
	// Snapshots form one chain, root first: the first stands alone, each
	// later one is a layer on the one before it, and the head is last.
	// Version 1 holds exactly one.
	Snapshots []Snapshot `json:"snapshots"`
	// Files in stream order.
	Files []File `json:"files"`
}

// Image is one image of an archive.
type Image struct {
	Digest string `json:"digest"`
	// Manifest is the image's image.json, verbatim.
	Manifest json.RawMessage `json:"manifest"`
	// External: the archive lists the image's files but holds none of
	// their bytes (PackOptions.ExcludeImages); Unpack needs the image on
	// the receiving host already.
	External bool `json:"external,omitempty"`
}

// Snapshot is one snapshot of an archive.
type Snapshot struct {
	// ID is the snapshot's ID where it was packed; it names the snapshot's
	// directory in the archive. Unpack gives the snapshot a new ID.
	ID string `json:"id"`
	// Parent is the archive ID of the snapshot this one is a layer on (the
	// one before it); empty for the root. The snapshot manifest names the
	// same parent by tag and content digest (snapshot.ParentRef).
	Parent string `json:"parent,omitempty"`
	// Manifest is the snapshot's manifest.json with its image paths
	// (Image.Kernel, Initrd, Rootfs) rewritten to archive paths.
	Manifest snapshot.Manifest `json:"manifest"`
}

// File is one file of an archive.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Extents are the byte ranges stored in the archive, sorted.
	Extents []Extent `json:"extents"`
	// Copies are byte ranges equal to a range of an earlier file of the
	// list (or an earlier part of this one): pages a guest's page cache
	// shares with its root file system, or repeated pages. They are not
	// stored. Extents and copies do not overlap; everything they do not
	// cover reads as zeros.
	Copies []Copy `json:"copies,omitempty"`
}

// Extent is a stored byte range: [offset, length].
type Extent [2]int64

// Copy is a byte range copied from another file: [offset, length, index
// of the source in Manifest.Files, offset in the source].
type Copy [4]int64

// Off is the copy's first byte.
func (c Copy) Off() int64 { return c[0] }

// Len is the copy's length.
func (c Copy) Len() int64 { return c[1] }

// End is one past the copy's last byte.
func (c Copy) End() int64 { return c[0] + c[1] }

// Src is the index of the source file.
func (c Copy) Src() int64 { return c[2] }

// SrcOff is the offset of the range in the source file.
func (c Copy) SrcOff() int64 { return c[3] }

// Off is the extent's first byte.
func (e Extent) Off() int64 { return e[0] }

// Len is the extent's length.
func (e Extent) Len() int64 { return e[1] }

// End is one past the extent's last byte.
func (e Extent) End() int64 { return e[0] + e[1] }

// Stored is how many bytes of the file the archive holds (its tar size).
func (f *File) Stored() int64 {
	var n int64
	for _, e := range f.Extents {
		n += e.Len()
	}
	return n
}

func imageFilePath(digest, name string) string { return imagesDir + "/" + digest + "/" + name }
func snapshotFilePath(id, name string) string  { return snapshotsDir + "/" + id + "/" + name }

// imageManifest is the part of image.json an archive relies on.
type imageManifest struct {
	FormatVersion int    `json:"format_version"`
	Digest        string `json:"digest"`
	Recipe        struct {
		Name string `json:"name"`
	} `json:"recipe"`
	Files map[string]snapshot.FileEntry `json:"files"`
}

var (
	digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
	idPattern     = regexp.MustCompile(`^[0-9a-z][0-9a-z_-]{0,63}$`)
	namePattern   = regexp.MustCompile(`^[0-9a-z][0-9a-z._-]{0,63}$`)
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("invalid archive: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// validName checks a file name inside an image or snapshot directory.
func validName(name, reserved string) bool {
	return namePattern.MatchString(name) && name != reserved && !strings.HasPrefix(name, ".")
}

// parseManifest decodes and checks forkd-archive.json: layout, names,
// extents and the agreement of every file with the manifests that list it.
// It does not check limits, which depend on UnpackOptions.
func parseManifest(data []byte) (*Manifest, error) {
	var probe struct {
		FormatVersion int `json:"format_version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, invalid("%s is not JSON: %v", ManifestName, err)
	}
	if probe.FormatVersion < flatFormat || probe.FormatVersion > FormatVersion {
		return nil, invalid("format version %d, this forkd reads versions %d to %d (upgrade forkd?)", probe.FormatVersion, flatFormat, FormatVersion)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, invalid("%s: %v (written by a newer forkd?)", ManifestName, err)
	}
	if dec.More() {
		return nil, invalid("%s holds more than one JSON value", ManifestName)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *Manifest) check() error {
	switch {
	case len(m.Snapshots) == 0:
		return invalid("no snapshot")
	case len(m.Snapshots) > maxSnapshots:
		return invalid("%d snapshots, at most %d", len(m.Snapshots), maxSnapshots)
	case len(m.Images) > maxImages:
		return invalid("%d images, at most %d", len(m.Images), maxImages)
	case m.Head != m.Snapshots[len(m.Snapshots)-1].ID:
		return invalid("head %q is not the last snapshot", m.Head)
	}
	files := map[string]*File{}
	for i := range m.Files {
		f := &m.Files[i]
		if files[f.Path] != nil {
			return invalid("file %q listed twice", f.Path)
		}
		if err := f.check(i, m.Files); err != nil {
			return err
		}
		files[f.Path] = f
	}
	// want collects the archive paths the images and snapshots imply; the
	// file list must be exactly those.
	want := map[string]bool{}
	expect := func(p string, e snapshot.FileEntry) error {
		f := files[p]
		if f == nil {
			return invalid("%s is not in the file list", p)
		}
		if f.Size != e.Size || f.SHA256 != e.SHA256 {
			return invalid("%s: file list says %d bytes sha256 %s, its manifest %d bytes sha256 %s", p, f.Size, f.SHA256, e.Size, e.SHA256)
		}
		want[p] = true
		return nil
	}
	images := map[string]*imageManifest{}
	for _, img := range m.Images {
		if !digestPattern.MatchString(img.Digest) {
			return invalid("image digest %q", img.Digest)
		}
		if images[img.Digest] != nil {
			return invalid("image %s listed twice", img.Digest)
		}
		im, err := parseImageManifest(img.Manifest)
		if err != nil {
			return invalid("image %s: %v", img.Digest, err)
		}
		if im.Digest != img.Digest {
			return invalid("image %s: image.json names digest %q", img.Digest, im.Digest)
		}
		for name, e := range im.Files {
			p := imageFilePath(img.Digest, name)
			if err := expect(p, e); err != nil {
				return err
			}
			if f := files[p]; img.External && (len(f.Extents) > 0 || len(f.Copies) > 0) {
				return invalid("%s: file of an image packed without its bytes has extents", p)
			}
		}
		images[img.Digest] = im
	}
	ids := map[string]bool{}
	for i := range m.Snapshots {
		s := &m.Snapshots[i]
		if !idPattern.MatchString(s.ID) {
			return invalid("snapshot id %q", s.ID)
		}
		if ids[s.ID] {
			return invalid("snapshot %s listed twice", s.ID)
		}
		if s.Parent != "" && !ids[s.Parent] {
			return invalid("snapshot %s: parent %q is not an earlier snapshot of the archive", s.ID, s.Parent)
		}
		ids[s.ID] = true
		sm := &s.Manifest
		if sm.FormatVersion < 1 || sm.FormatVersion > snapshot.FormatVersion {
			return invalid("snapshot %s has manifest format %d, this forkd reads up to %d", s.ID, sm.FormatVersion, snapshot.FormatVersion)
		}
		if snapshot.ValidateTag(sm.Tag) != nil {
			return invalid("snapshot %s has tag %q: %s", s.ID, sm.Tag, snapshot.TagRule)
		}
		if err := checkMachine(sm); err != nil {
			return invalid("snapshot %s: %v", s.ID, err)
		}
		im := images[sm.Image.Digest]
		if im == nil {
			return invalid("snapshot %s boots image %q, which the archive does not hold", s.ID, sm.Image.Digest)
		}
		for _, p := range []string{sm.Image.Kernel, sm.Image.Initrd, sm.Image.Rootfs} {
			if p == "" {
				continue
			}
			dir, name := path.Split(p)
			if dir != imagesDir+"/"+sm.Image.Digest+"/" {
				return invalid("snapshot %s: image path %q is not inside its image", s.ID, p)
			}
			if _, ok := im.Files[name]; !ok {
				return invalid("snapshot %s: image path %q names no file of the image", s.ID, p)
			}
		}
		if len(sm.Files) == 0 {
			return invalid("snapshot %s has no files", s.ID)
		}
		for name, e := range sm.Files {
			if !validName(name, snapshot.ManifestFile) {
				return invalid("snapshot %s: file name %q", s.ID, name)
			}
			if err := expect(snapshotFilePath(s.ID, name), e); err != nil {
				return err
			}
		}
	}
	for p := range files {
		if !want[p] {
			return invalid("file %q belongs to no image or snapshot of the archive", p)
		}
	}
	return m.checkChain()
}

// checkChain checks that the snapshots hold together as one chain, root
// first: the root stands alone at depth 0, and each later snapshot is a
// layer on the one before it that names it by tag and by the content
// digest its manifest yields (the files' sizes and SHA-256, which Unpack
// then checks every byte against), one level deeper, with the files a
// layer needs and as much memory as its root. An archive that passes
// holds every ancestor its head needs, so what Unpack writes can be
// forked, and no layer ends up on a parent other than the one it was
// taken from.
func (m *Manifest) checkChain() error {
	if m.FormatVersion == flatFormat && len(m.Snapshots) != 1 {
		return invalid("format version %d holds one snapshot, this one %d", flatFormat, len(m.Snapshots))
	}
	if len(m.Snapshots) > snapshot.MaxChainDepth+1 {
		return invalid("a chain of %d snapshots, deeper than the %d layers forkd allows", len(m.Snapshots), snapshot.MaxChainDepth)
	}
	root := &m.Snapshots[0].Manifest
	tags := map[string]bool{}
	for i := range m.Snapshots {
		s := &m.Snapshots[i]
		sm := &s.Manifest
		if tags[sm.Tag] {
			return invalid("tag %q names two snapshots of the chain", sm.Tag)
		}
		tags[sm.Tag] = true
		if i == 0 {
			if sm.Parent != nil || s.Parent != "" {
				p := s.Parent
				if sm.Parent != nil {
					p = sm.Parent.Tag
				}
				return invalid("snapshot %q is a layer on %q, which the archive does not hold (packed by an older forkd? pack it again)", sm.Tag, p)
			}
			if sm.Depth != 0 {
				return invalid("root snapshot %q has depth %d", sm.Tag, sm.Depth)
			}
			continue
		}
		prev := &m.Snapshots[i-1]
		if s.Parent != prev.ID || sm.Parent == nil {
			return invalid("snapshot %q is not a layer on %q, the snapshot before it in the chain", sm.Tag, prev.Manifest.Tag)
		}
		if sm.Parent.Tag != prev.Manifest.Tag {
			return invalid("layer %q names its parent %q, but the snapshot before it is %q", sm.Tag, sm.Parent.Tag, prev.Manifest.Tag)
		}
		if d := digestOf(&prev.Manifest); sm.Parent.Digest != d {
			return invalid("layer %q was taken on %q with digest %s, but the archive's %q has digest %s: the chain does not hold together",
				sm.Tag, sm.Parent.Tag, sm.Parent.Digest, prev.Manifest.Tag, d)
		}
		if sm.Depth != prev.Manifest.Depth+1 {
			return invalid("layer %q has depth %d on %q of depth %d", sm.Tag, sm.Depth, prev.Manifest.Tag, prev.Manifest.Depth)
		}
		for _, name := range []string{snapshot.MemoryFile, snapshot.LayerIndexFile} {
			if _, ok := sm.Files[name]; !ok {
				return invalid("layer %q has no %s", sm.Tag, name)
			}
		}
		if got, want := sm.Files[snapshot.MemoryFile].Size, root.Files[snapshot.MemoryFile].Size; got != want {
			return invalid("layer %q holds %d bytes of memory, its root %q %d", sm.Tag, got, root.Tag, want)
		}
	}
	return nil
}

// digestOf is the content digest of a snapshot manifest
// (snapshot.Snapshot.Digest): its files' names, sizes and SHA-256 and its
// parent's digest.
func digestOf(sm *snapshot.Manifest) string {
	return (&snapshot.Snapshot{Manifest: *sm}).Digest()
}

var (
	macPattern  = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	wordPattern = regexp.MustCompile(`^[0-9a-z_.-]{0,32}$`)
	argPattern  = regexp.MustCompile(`^[!-~]{1,256}$`) // printable ASCII, no spaces
)

// checkMachine checks the fields of a snapshot manifest that reach the
// VMM's command line or the host's network setup. Manifests used to be
// written only by this host; from an archive they are input.
func checkMachine(sm *snapshot.Manifest) error {
	n := sm.Network
	if n.GuestMAC != "" && !macPattern.MatchString(n.GuestMAC) {
		return fmt.Errorf("guest MAC %q", n.GuestMAC)
	}
	for _, ip := range []string{n.GuestIP, n.GatewayIP} {
		if a, err := netip.ParseAddr(ip); ip != "" && (err != nil || a.String() != ip) {
			return fmt.Errorf("network address %q", ip)
		}
	}
	if len(sm.Image.KernelArgs) > 64 {
		return fmt.Errorf("%d kernel arguments", len(sm.Image.KernelArgs))
	}
	for _, a := range sm.Image.KernelArgs {
		if !argPattern.MatchString(a) {
			return fmt.Errorf("kernel argument %q", a)
		}
	}
	if !wordPattern.MatchString(sm.VMM.Kind) || !wordPattern.MatchString(sm.VMM.Accel) {
		return fmt.Errorf("VMM %q accelerator %q", sm.VMM.Kind, sm.VMM.Accel)
	}
	if sm.MemoryMiB < 0 || sm.MemoryMiB > 1<<20 || sm.VCPUs < 0 || sm.VCPUs > 1024 {
		return fmt.Errorf("%d MiB, %d vCPUs", sm.MemoryMiB, sm.VCPUs)
	}
	if sm.CPUMillicores < 0 || sm.CPUMillicores > int64(sm.VCPUs)*1000 {
		return fmt.Errorf("cpu_millicores %d with %d vCPUs", sm.CPUMillicores, sm.VCPUs)
	}
	return nil
}

func parseImageManifest(raw json.RawMessage) (*imageManifest, error) {
	var im imageManifest
	if err := json.Unmarshal(raw, &im); err != nil {
		return nil, fmt.Errorf("image.json: %v", err)
	}
	if im.FormatVersion != imageFormat {
		return nil, fmt.Errorf("image format %d, this forkd reads %d", im.FormatVersion, imageFormat)
	}
	if len(im.Files) == 0 {
		return nil, fmt.Errorf("image.json lists no files")
	}
	for name, e := range im.Files {
		if !validName(name, imageManifestName) {
			return nil, fmt.Errorf("file name %q", name)
		}
		if e.Size < 0 || !digestPattern.MatchString(e.SHA256) {
			return nil, fmt.Errorf("file %s: size %d sha256 %q", name, e.Size, e.SHA256)
		}
	}
	return &im, nil
}

// check validates a file's extents and copies: sorted, not overlapping,
// inside the file, and copies only from earlier files (or from earlier in
// the file itself) and inside their source.
func (f *File) check(idx int, files []File) error {
	if f.Size < 0 {
		return invalid("%s: size %d", f.Path, f.Size)
	}
	if !digestPattern.MatchString(f.SHA256) {
		return invalid("%s: sha256 %q", f.Path, f.SHA256)
	}
	if n := len(f.Extents) + len(f.Copies); n > maxExtentsPerFile {
		return invalid("%s: %d extents and copies, at most %d", f.Path, n, maxExtentsPerFile)
	}
	for _, c := range f.Copies {
		src := c.Src()
		if src < 0 || src > int64(idx) {
			return invalid("%s: copy from file %d, which is not listed before it", f.Path, src)
		}
		limit := files[src].Size
		if src == int64(idx) {
			limit = c.Off() // only what is already written
		}
		// Bounds are checked before they are added to, so nothing overflows.
		if c.SrcOff() < 0 || c.Len() <= 0 || c.SrcOff() > limit || c.Len() > limit-c.SrcOff() {
			return invalid("%s: copy [%d, +%d) from %s at %d is outside its source", f.Path, c.Off(), c.Len(), files[src].Path, c.SrcOff())
		}
	}
	var end int64
	err := f.segments(func(off, n int64, _ *Copy) error {
		if off < end || n <= 0 || off > f.Size || n > f.Size-off {
			return invalid("%s: range [%d, +%d) is out of order, overlapping, empty or past the size %d", f.Path, off, n, f.Size)
		}
		end = off + n
		return nil
	})
	return err
}

// segments calls fn for the extents (c nil) and copies of f in the order
// of their offsets. It does not check them.
func (f *File) segments(fn func(off, n int64, c *Copy) error) error {
	i, j := 0, 0
	for i < len(f.Extents) || j < len(f.Copies) {
		if j == len(f.Copies) || (i < len(f.Extents) && f.Extents[i].Off() <= f.Copies[j].Off()) {
			if err := fn(f.Extents[i].Off(), f.Extents[i].Len(), nil); err != nil {
				return err
			}
			i++
			continue
		}
		if err := fn(f.Copies[j].Off(), f.Copies[j].Len(), &f.Copies[j]); err != nil {
			return err
		}
		j++
	}
	return nil
}

// The archive starts with a zstd skippable frame that tells Sign where the
// manifest and signature frames end. Decoders skip it; Unpack ignores it.
const (
	skippableMagic = 0x184D2A5E
	headerMagic    = "FORKDAR1"
	headerSize     = 8 + 24 // frame magic and length, then the payload
)

type frameHeader struct {
	manifestLen  uint64 // compressed length of the manifest frame
	signatureLen uint64 // compressed length of the signature frame; 0 if unsigned
}

func (h frameHeader) marshal() []byte {
	b := make([]byte, headerSize)
	binary.LittleEndian.PutUint32(b[0:], skippableMagic)
	binary.LittleEndian.PutUint32(b[4:], headerSize-8)
	copy(b[8:], headerMagic)
	binary.LittleEndian.PutUint64(b[16:], h.manifestLen)
	binary.LittleEndian.PutUint64(b[24:], h.signatureLen)
	return b
}

func parseFrameHeader(b []byte) (frameHeader, error) {
	if len(b) != headerSize || binary.LittleEndian.Uint32(b[0:]) != skippableMagic ||
		binary.LittleEndian.Uint32(b[4:]) != headerSize-8 || string(b[8:16]) != headerMagic {
		return frameHeader{}, fmt.Errorf("not a forkd archive (no %s header frame): %w", headerMagic, errdefs.ErrInvalidArgument)
	}
	return frameHeader{manifestLen: binary.LittleEndian.Uint64(b[16:]), signatureLen: binary.LittleEndian.Uint64(b[24:])}, nil
}
