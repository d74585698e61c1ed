package pack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/maphash"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

const (
	// pageSize is the granularity of zero detection and deduplication.
	pageSize = 4096
	// minHole is the shortest run of zero pages inside allocated data that
	// Pack leaves out. Shorter runs cost zstd almost nothing and would only
	// lengthen the extent list.
	minHole = 64 << 10
	// chunkSize is the read and write unit.
	chunkSize = 1 << 20
	// maxIndexedPages bounds the page index (about 40 bytes per page).
	maxIndexedPages = 1 << 22
	// maxCopies bounds the copies of an archive, so its manifest stays
	// well under maxManifestBytes.
	maxCopies = 1 << 18
)

// zeros is never written to.
var zeros = make([]byte, chunkSize)

// hashZeros feeds n zero bytes to h.
func hashZeros(h hash.Hash, n int64) {
	for n > 0 {
		k := min(n, int64(len(zeros)))
		h.Write(zeros[:k])
		n -= k
	}
}

// dataRanges lists the allocated ranges of f (SEEK_DATA/SEEK_HOLE). A file
// system without hole reporting yields one range covering the file.
func dataRanges(f *os.File, size int64) ([]Extent, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var out []Extent
	var serr error
	err = raw.Control(func(fd uintptr) {
		for off := int64(0); off < size; {
			d, err := unix.Seek(int(fd), off, unix.SEEK_DATA)
			if errors.Is(err, unix.ENXIO) {
				return // only a hole is left
			}
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				out = []Extent{{0, size}}
				return
			}
			if err != nil {
				serr = err
				return
			}
			h, err := unix.Seek(int(fd), d, unix.SEEK_HOLE)
			if err != nil {
				serr = err
				return
			}
			h = min(h, size)
			if h <= d {
				return
			}
			out = append(out, Extent{d, h - d})
			off = h
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return nil, fmt.Errorf("map extents of %s: %w", f.Name(), err)
	}
	return out, nil
}

// pageRef locates a page of a scanned file.
type pageRef struct {
	file int // index in the manifest's file list
	off  int64
}

// mapping is what scanning a file yields.
type mapping struct {
	extents []Extent
	copies  []Copy
	sha256  string
	// pages are the file's distinct non-zero pages by hash, at their first
	// offset: the index later files deduplicate against.
	pages map[uint64]int64
}

// scanner maps files: their stored extents, and copies of pages that files
// scanned earlier (known) or the file itself already hold.
type scanner struct {
	seed  maphash.Seed
	known map[uint64]pageRef // not written while files are scanned
	files []*os.File         // by file index, to compare candidate pages
	// copies and indexed count down the copies and index entries left.
	copies, indexed atomic.Int64
}

func newScanner(files []*os.File) *scanner {
	sc := &scanner{seed: maphash.MakeSeed(), known: map[uint64]pageRef{}, files: files}
	sc.copies.Store(maxCopies)
	sc.indexed.Store(maxIndexedPages)
	return sc
}

// learn adds the pages of file idx to the index later files use.
func (sc *scanner) learn(idx int, pages map[uint64]int64) {
	for h, off := range pages {
		if _, ok := sc.known[h]; !ok {
			sc.known[h] = pageRef{file: idx, off: off}
		}
	}
}

// same reports whether page equals the page at ref.
func (sc *scanner) same(ref pageRef, page, tmp []byte) bool {
	n, err := sc.files[ref.file].ReadAt(tmp, ref.off)
	return n == len(tmp) && (err == nil || errors.Is(err, io.EOF)) && bytes.Equal(tmp, page)
}

// scan maps file idx and returns the SHA-256 of its whole logical
// content. Data is read once; pages are hashed for deduplication only
// when they are whole and aligned.
func (sc *scanner) scan(ctx context.Context, idx int, size int64) (*mapping, error) {
	f := sc.files[idx]
	ranges, err := dataRanges(f, size)
	if err != nil {
		return nil, err
	}
	m := &mapping{pages: map[uint64]int64{}}
	h := sha256.New()
	buf := make([]byte, chunkSize)
	tmp := make([]byte, pageSize)
	var pos int64                      // hashed up to here
	start, end := int64(-1), int64(-1) // the open run of stored pages
	flush := func() {
		if start >= 0 {
			m.extents = append(m.extents, Extent{start, end - start})
			start = -1
		}
	}
	// addCopy records the page at o as a copy of ref, extending the last
	// copy where it continues it; false when the copy budget is spent.
	addCopy := func(o int64, ref pageRef) bool {
		if n := len(m.copies); n > 0 {
			c := &m.copies[n-1]
			if c.End() == o && c.Src() == int64(ref.file) && c.SrcOff()+c.Len() == ref.off {
				c[1] += pageSize
				return true
			}
		}
		if sc.copies.Add(-1) < 0 {
			return false
		}
		flush()
		m.copies = append(m.copies, Copy{o, pageSize, int64(ref.file), ref.off})
		return true
	}
	for _, r := range ranges {
		hashZeros(h, r.Off()-pos)
		for off := r.Off(); off < r.End(); {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			n := int(min(int64(len(buf)), r.End()-off))
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				if errors.Is(err, io.EOF) {
					return nil, fmt.Errorf("%s shrank while being read", f.Name())
				}
				return nil, err
			}
			h.Write(buf[:n])
			for b := 0; b < n; b += pageSize {
				page := buf[b:min(b+pageSize, n)]
				o := off + int64(b)
				if bytes.Equal(page, zeros[:len(page)]) {
					continue
				}
				if len(page) == pageSize && o%pageSize == 0 {
					if ref, ok := sc.match(idx, o, page, m, tmp); ok && addCopy(o, ref) {
						continue
					}
				}
				if start >= 0 && o-end < minHole {
					end = o + int64(len(page))
					continue
				}
				flush()
				start, end = o, o+int64(len(page))
			}
			off += int64(n)
		}
		flush()
		pos = r.End()
	}
	hashZeros(h, size-pos)
	m.sha256 = hex.EncodeToString(h.Sum(nil))
	return m, nil
}

// match looks page (at offset o of file idx) up among the known pages and
// the file's own earlier pages, and indexes it when it is new.
func (sc *scanner) match(idx int, o int64, page []byte, m *mapping, tmp []byte) (pageRef, bool) {
	key := maphash.Bytes(sc.seed, page)
	if ref, ok := sc.known[key]; ok && sc.same(ref, page, tmp) {
		return ref, true
	}
	if first, ok := m.pages[key]; ok && sc.same(pageRef{idx, first}, page, tmp) {
		return pageRef{idx, first}, true
	}
	if _, ok := m.pages[key]; !ok && sc.indexed.Add(-1) >= 0 {
		m.pages[key] = o
	}
	return pageRef{}, false
}
