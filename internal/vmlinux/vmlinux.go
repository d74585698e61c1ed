// Package vmlinux turns a Linux x86 bzImage (the vmlinuz Debian ships and
// forkd's images hold) into the uncompressed ELF vmlinux that Firecracker
// boots on x86_64. It reads the boot protocol header (Documentation/arch/
// x86/boot.rst: "HdrS", payload_offset and payload_length, protocol 2.08
// and later), decompresses the payload (LZ4 legacy frames, gzip or zstd,
// the formats Debian's kernels use) and checks that the result is an
// x86-64 ELF executable with loadable segments. Every size read from the
// file is bounded: a bzImage is untrusted input like any image file.
package vmlinux

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Limits on what is read and written.
const (
	// MaxImage bounds the bzImage read.
	MaxImage = 256 << 20
	// MaxELF bounds the decompressed kernel: a distribution's vmlinux
	// is 30-60 MiB, one with debug sections some hundreds.
	MaxELF = 256 << 20
	// lz4LegacyBlock is the largest block of the LZ4 legacy format.
	lz4LegacyBlock = 8 << 20
)

// elfLimit is MaxELF, lowered by tests.
var elfLimit = MaxELF

var (
	magicGzip      = []byte{0x1f, 0x8b}
	magicZstd      = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicLZ4Legacy = []byte{0x02, 0x21, 0x4c, 0x18}
	magicELF       = []byte{0x7f, 'E', 'L', 'F'}
)

// IsELF reports whether the file at path starts like an ELF file.
func IsELF(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	head := make([]byte, 4)
	if _, err := io.ReadFull(f, head); err != nil {
		return false, nil // shorter than any ELF
	}
	return bytes.Equal(head, magicELF), nil
}

// Extract returns the ELF vmlinux inside bzImage.
func Extract(bzImage []byte) ([]byte, error) {
	payload, err := payloadOf(bzImage)
	if err != nil {
		return nil, err
	}
	var out []byte
	hint := sizeHint(payload)
	switch {
	case bytes.HasPrefix(payload, magicLZ4Legacy):
		out, err = lz4Legacy(payload[len(magicLZ4Legacy):], hint)
	case bytes.HasPrefix(payload, magicGzip):
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(payload)); err == nil {
			zr.Multistream(false)
			out, err = readBounded(zr, hint)
		}
	case bytes.HasPrefix(payload, magicZstd):
		out, err = unzstd(payload, hint)
	default:
		n := min(len(payload), 6)
		return nil, fmt.Errorf("bzImage payload compressed with an unsupported format (magic %x): LZ4, gzip and zstd are read; extract it with the kernel's scripts/extract-vmlinux and give the ELF instead: %w", payload[:n], errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("bzImage payload: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := checkELF(out); err != nil {
		return nil, err
	}
	return out, nil
}

// payloadOf is the compressed kernel a bzImage carries.
func payloadOf(b []byte) ([]byte, error) {
	bad := func(why string) error {
		return fmt.Errorf("not a bzImage (%s): give the kernel's vmlinuz or an ELF vmlinux: %w", why, errdefs.ErrInvalidArgument)
	}
	if len(b) < 0x250 || string(b[0x202:0x206]) != "HdrS" {
		return nil, bad("no HdrS boot header")
	}
	if proto := binary.LittleEndian.Uint16(b[0x206:]); proto < 0x208 {
		return nil, bad(fmt.Sprintf("boot protocol %#x, before payload fields (2.08)", proto))
	}
	setupSects := int(b[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	off := uint64(setupSects+1)*512 + uint64(binary.LittleEndian.Uint32(b[0x248:]))
	n := uint64(binary.LittleEndian.Uint32(b[0x24c:]))
	if n == 0 || off+n > uint64(len(b)) {
		return nil, bad(fmt.Sprintf("payload %d bytes at %d in a file of %d", n, off, len(b)))
	}
	return b[off : off+n], nil
}

// lz4Legacy decompresses LZ4's legacy frame format (after its magic):
// blocks of at most 8 MiB, each a little-endian compressed length and an
// LZ4 block. The kernel's build appends the decompressed size (4 bytes)
// after the last block; it is checked when present.
func lz4Legacy(b []byte, hint int) ([]byte, error) {
	out := make([]byte, 0, hint)
	block := make([]byte, lz4LegacyBlock)
	for len(b) >= 4 {
		n := binary.LittleEndian.Uint32(b)
		if n == binary.LittleEndian.Uint32(magicLZ4Legacy) {
			b = b[4:] // a concatenated stream: its next frame
			continue
		}
		if uint64(n) > uint64(len(b)-4) || int64(n) > int64(lz4.CompressBlockBound(lz4LegacyBlock)) {
			break // not a block: the appended size, or the end
		}
		m, err := lz4.UncompressBlock(b[4:4+n], block)
		if err != nil {
			return nil, fmt.Errorf("lz4 block at %d: %w", len(out), err)
		}
		if len(out)+m > elfLimit {
			return nil, fmt.Errorf("decompresses past %d MiB", elfLimit>>20)
		}
		out = append(out, block[:m]...)
		b = b[4+n:]
	}
	if len(out) == 0 {
		return nil, errors.New("lz4: no block")
	}
	if len(b) == 4 {
		if want := binary.LittleEndian.Uint32(b); uint64(want) != uint64(len(out)) {
			return nil, fmt.Errorf("lz4: %d bytes decompressed, the image says %d", len(out), want)
		}
	}
	return out, nil
}

// unzstd decompresses a zstd payload. The kernel's build appends the
// decompressed size (4 bytes) after the frame, which a zstd reader takes
// for a bad frame: the payload without it is tried first, and the size
// checked.
func unzstd(payload []byte, hint int) ([]byte, error) {
	dec := func(b []byte) ([]byte, error) {
		zr, err := zstd.NewReader(bytes.NewReader(b), zstd.WithDecoderMaxMemory(uint64(elfLimit)), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		return readBounded(zr, hint)
	}
	if n := len(payload) - 4; n > len(magicZstd) {
		if out, err := dec(payload[:n]); err == nil && uint64(binary.LittleEndian.Uint32(payload[n:])) == uint64(len(out))&0xffffffff {
			return out, nil
		}
	}
	return dec(payload)
}

// readBounded reads r to its end, at most MaxELF bytes, into a buffer of
// hint bytes to begin with.
func readBounded(r io.Reader, hint int) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, hint))
	_, err := buf.ReadFrom(io.LimitReader(r, int64(elfLimit)+1))
	if err == nil && buf.Len() > elfLimit {
		err = fmt.Errorf("decompresses past %d MiB", elfLimit>>20)
	}
	return buf.Bytes(), err
}

// sizeHint is the decompressed size the kernel's build appends to the
// payload (gzip's own trailer says the same), if it is within MaxELF;
// else 0. It only sizes the first allocation: nothing trusts it.
func sizeHint(payload []byte) int {
	if len(payload) < 8 {
		return 0
	}
	n := binary.LittleEndian.Uint32(payload[len(payload)-4:])
	if uint64(n) > uint64(elfLimit) {
		return 0
	}
	return int(n)
}

// checkELF accepts an x86-64 executable with loadable segments.
func checkELF(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("the decompressed kernel is not an ELF file (%v): %w", err, errdefs.ErrInvalidArgument)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		return fmt.Errorf("the decompressed kernel is %v %v %v, want a 64-bit x86-64 executable: %w", f.Class, f.Machine, f.Type, errdefs.ErrInvalidArgument)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			return nil
		}
	}
	return fmt.Errorf("the decompressed kernel has no loadable segment: %w", errdefs.ErrInvalidArgument)
}

// Ensure returns an ELF vmlinux for kernel: kernel itself when it is one,
// else a file extracted from it once and kept beside it, named by the
// bzImage's hash (staged, fsynced and renamed, so a crash leaves no
// partial file and a kernel replaced in place gets a new one).
func Ensure(kernel string) (string, error) {
	isELF, err := IsELF(kernel)
	if err != nil || isELF {
		return kernel, err
	}
	f, err := os.Open(kernel)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxImage+1))
	f.Close()
	if err != nil {
		return "", err
	}
	if len(b) > MaxImage {
		return "", fmt.Errorf("kernel %s is larger than %d MiB: %w", kernel, MaxImage>>20, errdefs.ErrInvalidArgument)
	}
	sum := sha256.Sum256(b)
	out := filepath.Join(filepath.Dir(kernel), "vmlinux-"+hex.EncodeToString(sum[:8]))
	if ok, _ := IsELF(out); ok {
		return out, nil
	}
	elfBytes, err := Extract(b)
	if err != nil {
		return "", fmt.Errorf("kernel %s: %w", kernel, err)
	}
	if err := fsutil.WriteFileAtomic(out, elfBytes, 0o444); err != nil {
		return "", err
	}
	return out, nil
}
