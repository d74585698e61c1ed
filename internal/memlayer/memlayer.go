// Package memlayer is the index of a memory layer: the list of guest pages
// a branch took from a running VM rather than from the memory image the VM
// was started from.
//
// A diff branch of a clone (package vmm, SnapshotDiff) writes a complete,
// sparse memory image: the parent's image with the pages the clone wrote
// copied over it. The index names those pages, so that a later step can
// keep only them (a layer) and rebuild or map the image from the parent
// plus its layers. The parent must then be the exact file the clone was
// started from (see Index.Parent), which never changes while anything
// depends on it.
//
// # File format
//
// All integers little-endian:
//
//	8 bytes  magic "FKDMLAY1"
//	u32      page size in bytes (4096)
//	u32      flags (0)
//	u64      memory image size in bytes
//	u64      number of extents N
//	N x      u64 first page, u64 page count  (ascending, disjoint, not adjacent)
//	u32      CRC-32C of everything before it
package memlayer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Magic starts every index file.
const Magic = "FKDMLAY1"

// headerSize is the fixed part before the extents.
const headerSize = 8 + 4 + 4 + 8 + 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is returned for an index file that does not decode.
var ErrCorrupt = errors.New("memlayer: corrupt index")

// Extent is a run of pages.
type Extent struct {
	First uint64 // page number
	Count uint64 // pages
}

// Index lists the pages of a layer.
type Index struct {
	PageSize   uint32
	MemorySize uint64
	Extents    []Extent
}

// Builder accumulates pages in any order and produces a normalized Index.
type Builder struct {
	PageSize   uint32
	MemorySize uint64
	ext        []Extent
}

// Add records count pages starting at page first.
func (b *Builder) Add(first, count uint64) {
	if count == 0 {
		return
	}
	if n := len(b.ext); n > 0 && b.ext[n-1].First+b.ext[n-1].Count == first {
		b.ext[n-1].Count += count
		return
	}
	b.ext = append(b.ext, Extent{first, count})
}

// Index returns the pages added so far, sorted and merged.
func (b *Builder) Index() *Index {
	ext := append([]Extent(nil), b.ext...)
	sort.Slice(ext, func(i, j int) bool { return ext[i].First < ext[j].First })
	var out []Extent
	for _, e := range ext {
		if n := len(out); n > 0 && out[n-1].First+out[n-1].Count >= e.First {
			if end := e.First + e.Count; end > out[n-1].First+out[n-1].Count {
				out[n-1].Count = end - out[n-1].First
			}
			continue
		}
		out = append(out, e)
	}
	return &Index{PageSize: b.PageSize, MemorySize: b.MemorySize, Extents: out}
}

// Pages is the number of pages in the index.
func (ix *Index) Pages() uint64 {
	var n uint64
	for _, e := range ix.Extents {
		n += e.Count
	}
	return n
}

// Contains reports whether page is in the index.
func (ix *Index) Contains(page uint64) bool {
	i := sort.Search(len(ix.Extents), func(i int) bool { return ix.Extents[i].First+ix.Extents[i].Count > page })
	return i < len(ix.Extents) && ix.Extents[i].First <= page
}

// Validate checks that the extents are sorted, disjoint, not adjacent and
// inside the memory size.
func (ix *Index) Validate() error {
	if ix.PageSize == 0 || ix.PageSize&(ix.PageSize-1) != 0 {
		return fmt.Errorf("%w: page size %d", ErrCorrupt, ix.PageSize)
	}
	pages := ix.MemorySize / uint64(ix.PageSize)
	var next uint64
	for i, e := range ix.Extents {
		if e.Count == 0 || e.First+e.Count > pages || e.First+e.Count < e.First {
			return fmt.Errorf("%w: extent %d (%d+%d) outside %d pages", ErrCorrupt, i, e.First, e.Count, pages)
		}
		if i > 0 && e.First <= next {
			return fmt.Errorf("%w: extent %d not after the previous one", ErrCorrupt, i)
		}
		next = e.First + e.Count
	}
	return nil
}

// MarshalBinary encodes the index in the file format.
func (ix *Index) MarshalBinary() ([]byte, error) {
	if err := ix.Validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, headerSize+16*len(ix.Extents)+4)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint32(b, ix.PageSize)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, ix.MemorySize)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ix.Extents)))
	for _, e := range ix.Extents {
		b = binary.LittleEndian.AppendUint64(b, e.First)
		b = binary.LittleEndian.AppendUint64(b, e.Count)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// UnmarshalBinary decodes the file format.
func (ix *Index) UnmarshalBinary(b []byte) error {
	if len(b) < headerSize+4 || !bytes.Equal(b[:8], []byte(Magic)) {
		return fmt.Errorf("%w: no header", ErrCorrupt)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	n := binary.LittleEndian.Uint64(body[24:32])
	if uint64(len(body)-headerSize) != 16*n {
		return fmt.Errorf("%w: %d extents in %d bytes", ErrCorrupt, n, len(body))
	}
	if flags := binary.LittleEndian.Uint32(body[12:16]); flags != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	out := Index{
		PageSize:   binary.LittleEndian.Uint32(body[8:12]),
		MemorySize: binary.LittleEndian.Uint64(body[16:24]),
		Extents:    make([]Extent, n),
	}
	for i := range out.Extents {
		p := body[headerSize+16*i:]
		out.Extents[i] = Extent{binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])}
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*ix = out
	return nil
}

// WriteFile writes the index atomically (temporary file, fsync, rename).
func WriteFile(path string, ix *Index) error {
	b, err := ix.MarshalBinary()
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b, 0o600)
}

// ReadFile reads an index file.
func ReadFile(path string) (*Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<30))
	if err != nil {
		return nil, err
	}
	var ix Index
	if err := ix.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &ix, nil
}
