package pack

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// An archive's content splits into parts: the files of one image, or of
// one snapshot of the chain, in stream order. A registry (internal/oci)
// stores each part as its own content-addressed blob, so that a host
// fetches only the parts it lacks and rebuilds the others from its own
// files (LocalPart); Assemble joins the parts back into an archive stream
// that Unpack reads as it reads any other, with the same checks.
//
// A part's bytes are one zstd frame of the tar entries of its files (no
// trailer), with every header field that is not content fixed (a zero
// modification time), compressed by one goroutine: the same files with
// the same extents always give the same bytes, so the same image or
// ancestor pushed again, or as part of another chain, is the same blob.

// Part kinds.
const (
	PartImage    = "image"
	PartSnapshot = "snapshot"
)

// Part is one image or snapshot of an archive and its files.
type Part struct {
	Kind string // PartImage or PartSnapshot
	// Name is the image's digest or the snapshot's archive ID.
	Name string
	// Tag is the snapshot's tag (empty for an image).
	Tag   string
	Files []int // indexes into Manifest.Files, in stream order
}

// ID names the part in a registry manifest: "image/<digest>" or
// "snapshot/<archive ID>".
func (p Part) ID() string { return p.Kind + "/" + p.Name }

// Parts lists the parts of m in stream order. Files of images packed
// without their bytes form no part.
func (m *Manifest) Parts() ([]Part, error) {
	tags := map[string]string{}
	for _, s := range m.Snapshots {
		tags[s.ID] = s.Manifest.Tag
	}
	external := map[string]bool{}
	for _, img := range m.Images {
		external[img.Digest] = img.External
	}
	var parts []Part
	seen := map[string]bool{}
	for i, f := range m.Files {
		top, rest, _ := strings.Cut(f.Path, "/")
		name, _, _ := strings.Cut(rest, "/")
		kind := PartImage
		if top == snapshotsDir {
			kind = PartSnapshot
		}
		if kind == PartImage && external[name] {
			continue
		}
		if n := len(parts); n > 0 && parts[n-1].Kind == kind && parts[n-1].Name == name {
			parts[n-1].Files = append(parts[n-1].Files, i)
			continue
		}
		p := Part{Kind: kind, Name: name, Tag: tags[name], Files: []int{i}}
		if seen[p.ID()] {
			return nil, invalid("the files of %s are not contiguous", p.ID())
		}
		seen[p.ID()] = true
		parts = append(parts, p)
	}
	return parts, nil
}

// ParseVerified checks the signature of a manifest (forkd-archive.json's
// bytes) under opts' policy, as Unpack does, and then parses it: with a
// key, nothing unsigned is interpreted.
func ParseVerified(data, sig []byte, opts UnpackOptions) (*Manifest, error) {
	if len(data) > maxManifestBytes || len(sig) > maxSignatureBytes {
		return nil, invalid("manifest of %d bytes or signature of %d bytes, at most %d and %d", len(data), len(sig), maxManifestBytes, maxSignatureBytes)
	}
	if len(opts.TrustedKeys) > 0 {
		if err := verifyTrusted(opts.TrustedKeys, data, sig); err != nil {
			return nil, err
		}
	}
	if opts.VerifyKey != nil {
		if err := verifyManifest(opts.VerifyKey, data, sig); err != nil {
			return nil, err
		}
	}
	return parseManifest(data)
}

// PartReader reads an archive stream part by part (for a push).
type PartReader struct {
	Manifest  *Manifest
	Raw       []byte // forkd-archive.json's bytes, as signed
	Signature []byte // nil if unsigned
	Parts     []Part

	zr   *zstd.Decoder
	st   *stream
	next int
}

// ReadParts reads an archive's manifest and signature from r; the parts
// follow with WriteNext.
func ReadParts(r io.Reader) (*PartReader, error) {
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	u := &unpacker{}
	st := &stream{tr: tar.NewReader(zr)}
	if err := u.readManifest(st); err != nil {
		zr.Close()
		return nil, err
	}
	pr := &PartReader{Manifest: u.m, Raw: u.raw, Signature: u.sig, zr: zr, st: st}
	if pr.Parts, err = u.m.Parts(); err != nil {
		zr.Close()
		return nil, err
	}
	return pr, nil
}

// Close releases the decoder.
func (pr *PartReader) Close() { pr.zr.Close() }

// WriteNext writes the next part's bytes to w (see the Part comment) and
// returns the part; io.EOF after the last one, once the stream's end was
// checked.
func (pr *PartReader) WriteNext(w io.Writer) (Part, error) {
	if pr.next == len(pr.Parts) {
		if err := finish(pr.st, pr.zr); err != nil {
			return Part{}, err
		}
		return Part{}, io.EOF
	}
	p := pr.Parts[pr.next]
	pr.next++
	err := writePart(w, func(tw *tar.Writer) error {
		for _, i := range p.Files {
			f := &pr.Manifest.Files[i]
			hdr, err := pr.st.next(f.Path)
			if errors.Is(err, io.EOF) {
				return invalid("archive ends before %s (truncated?)", f.Path)
			}
			if err != nil {
				return err
			}
			if err := checkEntry(hdr, f.Path, f.Stored()); err != nil {
				return err
			}
			if err := writeEntry(tw, f, io.LimitReader(pr.st.tr, f.Stored())); err != nil {
				return readErr(f.Path, err)
			}
		}
		return nil
	})
	return p, err
}

// writePart writes one zstd frame of the tar entries fill writes.
func writePart(w io.Writer, fill func(*tar.Writer) error) error {
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(encoderLevel), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return err
	}
	defer enc.Close()
	tw := tar.NewWriter(enc)
	if err := fill(tw); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil { // no trailer: parts are concatenated
		return err
	}
	return enc.Close()
}

// writeEntry writes f's canonical tar entry with its stored bytes from r.
func writeEntry(tw *tar.Writer, f *File, r io.Reader) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Size: f.Stored(), Mode: 0o400, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	n, err := io.Copy(tw, r)
	if err == nil && n != f.Stored() {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// Assemble joins an archive's manifest, signature and parts (each
// Part's bytes, in the order of Manifest.Parts) into an archive stream
// for Unpack. Parts are read in order, only when Unpack reaches them.
func Assemble(raw, sig []byte, parts []io.Reader) (io.Reader, error) {
	zero := time.Unix(0, 0)
	manifestFrame, err := entryFrame(ManifestName, raw, zero)
	if err != nil {
		return nil, err
	}
	var sigFrame []byte
	if sig != nil {
		if sigFrame, err = entryFrame(SignatureName, sig, zero); err != nil {
			return nil, err
		}
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	trailer := enc.EncodeAll(make([]byte, 1024), nil) // two zero tar blocks
	enc.Close()
	hdr := frameHeader{manifestLen: uint64(len(manifestFrame)), signatureLen: uint64(len(sigFrame))}
	rs := []io.Reader{bytes.NewReader(hdr.marshal()), bytes.NewReader(manifestFrame), bytes.NewReader(sigFrame)}
	rs = append(rs, parts...)
	return io.MultiReader(append(rs, bytes.NewReader(trailer))...), nil
}

// HavePart reports whether this host holds part p of m already with the
// same content: an image with the same digest and file hashes, or a
// snapshot under the same tag with the same content digest (the head is
// never assumed here: Unpack decides what its tag means). LocalPart then
// rebuilds its bytes, which Unpack verifies as any others.
func HavePart(dataDir string, m *Manifest, p Part) bool {
	switch p.Kind {
	case PartImage:
		for _, img := range m.Images {
			if img.Digest == p.Name {
				u := &unpacker{imgRoot: filepath.Join(dataDir, imagesDir)}
				ok, err := u.localImage(img)
				return ok && err == nil
			}
		}
	case PartSnapshot:
		for i, s := range m.Snapshots {
			if s.ID != p.Name || i == len(m.Snapshots)-1 {
				continue
			}
			local, err := readSnapshot(dataDir, s.Manifest.Tag)
			return err == nil && local.Digest() == digestOf(&s.Manifest)
		}
	}
	return false
}

// LocalPart rebuilds part p's bytes from this host's copy (HavePart) as
// they are read. A file that changed since it was recorded gives bytes
// that Unpack refuses by their hash.
func LocalPart(dataDir string, m *Manifest, p Part) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writePart(pw, func(tw *tar.Writer) error {
			for _, i := range p.Files {
				f := &m.Files[i]
				_, rest, _ := strings.Cut(f.Path, "/") // <digest or ID>/<name>
				_, name, _ := strings.Cut(rest, "/")
				disk := filepath.Join(dataDir, imagesDir, p.Name, name)
				if p.Kind == PartSnapshot {
					disk = filepath.Join(dataDir, snapshotsDir, p.Tag, name)
				}
				if err := writeLocal(tw, f, disk); err != nil {
					return fmt.Errorf("rebuild %s from %s: %w", f.Path, disk, err)
				}
			}
			return nil
		}))
	}()
	return pr
}

func writeLocal(tw *tar.Writer, f *File, disk string) error {
	fd, err := os.OpenFile(disk, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition)
	}
	defer fd.Close()
	rs := make([]io.Reader, 0, len(f.Extents))
	for _, e := range f.Extents {
		rs = append(rs, io.NewSectionReader(fd, e.Off(), e.Len()))
	}
	return writeEntry(tw, f, io.MultiReader(rs...))
}
