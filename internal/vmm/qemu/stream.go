package qemu

// A reader and writer of QEMU 7.2's migration stream, as far as a branch
// needs it: the header, the configuration section, the sections of the
// "ram" save handler (page records) and, opaque, everything from the first
// device section on.
//
// Layout (migration/savevm.c and migration/ram.c of QEMU 7.2):
//
//	be32 magic "QEVM", be32 version 3
//	0x07 configuration: be32 len + machine type name, then subsections
//	     (0x05, u8 len + name, be32 version, fields), e.g. the list of
//	     migration capabilities the destination must also have
//	0x01 section start: be32 section id, u8 len + idstr, be32 instance,
//	     be32 version, content, footer
//	0x02 section part / 0x03 section end: be32 section id, content, footer
//	0x04 section full (device state): like 0x01, content not self-describing
//	0x00 end of file, then 0x06 + be32 len + JSON (description, unused
//	     when loading)
//	footer: 0x7e + be32 section id (machine types of the last years)
//
// The content of the "ram" sections is a sequence of records, each a be64
// of a page offset in its RAM block with flags in the low 12 bits:
//
//	MEM_SIZE 0x04  the offset is the total size; then per block: u8 len +
//	               idstr, be64 used length, and with x-ignore-shared be64
//	               guest address, until the lengths add up to the total
//	ZERO     0x02  [u8 len + idstr] u8 fill byte
//	PAGE     0x08  [u8 len + idstr] 4096 bytes
//	EOS      0x10  end of this section's records
//	CONTINUE 0x20  no idstr follows: same block as the previous record
//	               (carried across sections)
//
// Device sections cannot be parsed without QEMU's schemas, so a converter
// copies everything from the first 0x04 (or 0x00) on byte for byte: every
// stream QEMU writes has all of its "ram" sections before that point.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Stream constants of QEMU 7.2.
const (
	streamMagic   = 0x5145564d // "QEVM"
	streamVersion = 3

	secEOF           = 0x00
	secStart         = 0x01
	secPart          = 0x02
	secEnd           = 0x03
	secFull          = 0x04
	secSubsection    = 0x05
	secVMDescription = 0x06
	secConfiguration = 0x07
	secCommand       = 0x08
	secFooter        = 0x7e

	ramFlagZero     = 0x02
	ramFlagMemSize  = 0x04
	ramFlagPage     = 0x08
	ramFlagEOS      = 0x10
	ramFlagContinue = 0x20
	ramFlagMask     = 0xfff // flags live below the target page size

	ramSectionName    = "ram"
	ramSectionVersion = 4

	// memBlockName is the RAM block of guest memory: the id of the
	// memory-backend object the driver creates (args.go).
	memBlockName = "mem"

	// capIgnoreShared is the capability that makes the RAM block list
	// carry guest addresses.
	capIgnoreShared = "x-ignore-shared"

	pageSize = 4096
)

// errStream marks a stream the reader cannot handle.
var errStream = errors.New("migration stream")

func streamErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errStream, fmt.Sprintf(format, args...))
}

// streamConfig is the configuration section.
type streamConfig struct {
	Machine        string
	Caps           []string // migration capabilities to validate, in order
	TargetPageBits *uint32  // subsection present only on some targets
	UUID           []byte   // 16 bytes, subsection present with validate-uuid
}

func (c *streamConfig) ignoreShared() bool { return slices.Contains(c.Caps, capIgnoreShared) }

// ramBlockInfo is one entry of the MEM_SIZE block list.
type ramBlockInfo struct {
	Name   string
	Length uint64
	Addr   uint64 // guest address, only with x-ignore-shared
}

// ramRecord is one page record of a "ram" section.
type ramRecord struct {
	Flags  uint64
	Offset uint64 // in Block
	Block  string
	Fill   byte   // ZERO
	Data   []byte // PAGE: valid until the next read
}

// streamReader reads a migration stream.
type streamReader struct {
	r       *bufio.Reader
	n       int64 // bytes consumed
	capture *bytes.Buffer
	page    []byte
	last    string // block of the previous page record (CONTINUE)
}

func newStreamReader(r io.Reader) *streamReader {
	return &streamReader{r: bufio.NewReaderSize(r, 1<<20), page: make([]byte, pageSize)}
}

func (s *streamReader) full(p []byte) error {
	k, err := io.ReadFull(s.r, p)
	s.n += int64(k)
	if s.capture != nil {
		s.capture.Write(p[:k])
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w at byte %d: %w", errStream, s.n, err)
	}
	return nil
}

func (s *streamReader) u8() (byte, error) {
	b, err := s.r.ReadByte()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, fmt.Errorf("%w at byte %d: %w", errStream, s.n, err)
	}
	s.n++
	if s.capture != nil {
		s.capture.WriteByte(b)
	}
	return b, nil
}

func (s *streamReader) be32() (uint32, error) {
	var b [4]byte
	if err := s.full(b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b[:]), nil
}

func (s *streamReader) be64() (uint64, error) {
	var b [8]byte
	if err := s.full(b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

func (s *streamReader) str8() (string, error) {
	n, err := s.u8()
	if err != nil {
		return "", err
	}
	b := make([]byte, n)
	if err := s.full(b); err != nil {
		return "", err
	}
	return string(b), nil
}

func (s *streamReader) peek() (byte, error) {
	b, err := s.r.Peek(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

// header reads and checks the magic and version.
func (s *streamReader) header() error {
	m, err := s.be32()
	if err != nil {
		return err
	}
	v, err := s.be32()
	if err != nil {
		return err
	}
	if m != streamMagic || v != streamVersion {
		return streamErr("magic %#x version %d, want QEVM version %d", m, v, streamVersion)
	}
	return nil
}

// config reads the configuration section after its type byte.
func (s *streamReader) config() (streamConfig, error) {
	var c streamConfig
	n, err := s.be32()
	if err != nil {
		return c, err
	}
	if n > 256 {
		return c, streamErr("machine name of %d bytes", n)
	}
	name := make([]byte, n)
	if err := s.full(name); err != nil {
		return c, err
	}
	c.Machine = string(name)
	for {
		b, err := s.peek()
		if err != nil || b != secSubsection {
			return c, nil // the caller reads the next section type
		}
		s.u8()
		sub, err := s.str8()
		if err != nil {
			return c, err
		}
		if _, err := s.be32(); err != nil { // subsection version
			return c, err
		}
		switch sub {
		case "configuration/target-page-bits":
			v, err := s.be32()
			if err != nil {
				return c, err
			}
			c.TargetPageBits = &v
		case "configuration/capabilities":
			count, err := s.be32()
			if err != nil {
				return c, err
			}
			if count > 64 {
				return c, streamErr("%d capabilities", count)
			}
			for range count {
				cp, err := s.str8()
				if err != nil {
					return c, err
				}
				c.Caps = append(c.Caps, cp)
			}
		case "configuration/uuid":
			c.UUID = make([]byte, 16)
			if err := s.full(c.UUID); err != nil {
				return c, err
			}
		default:
			return c, streamErr("unknown configuration subsection %q", sub)
		}
	}
}

// sectionHeader is the header of a start, part, end or full section.
type sectionHeader struct {
	Type     byte
	ID       uint32
	Name     string // start and full
	Instance uint32 // start and full
	Version  uint32 // start and full
}

// sectionHeader reads a section header after its type byte t.
func (s *streamReader) sectionHeader(t byte) (sectionHeader, error) {
	h := sectionHeader{Type: t}
	var err error
	if h.ID, err = s.be32(); err != nil {
		return h, err
	}
	if t == secStart || t == secFull {
		if h.Name, err = s.str8(); err != nil {
			return h, err
		}
		if h.Instance, err = s.be32(); err != nil {
			return h, err
		}
		if h.Version, err = s.be32(); err != nil {
			return h, err
		}
	}
	return h, nil
}

// footer reads a section footer if there is one, and reports whether it
// was there.
func (s *streamReader) footer(id uint32) (bool, error) {
	b, err := s.peek()
	if err != nil || b != secFooter {
		return false, nil
	}
	s.u8()
	got, err := s.be32()
	if err != nil {
		return false, err
	}
	if got != id {
		return false, streamErr("footer of section %d closes section %d", got, id)
	}
	return true, nil
}

// blockList reads the block list of a MEM_SIZE record of total bytes.
func (s *streamReader) blockList(total uint64, ignoreShared bool) ([]ramBlockInfo, error) {
	var blocks []ramBlockInfo
	for total > 0 {
		name, err := s.str8()
		if err != nil {
			return nil, err
		}
		b := ramBlockInfo{Name: name}
		if b.Length, err = s.be64(); err != nil {
			return nil, err
		}
		if ignoreShared {
			if b.Addr, err = s.be64(); err != nil {
				return nil, err
			}
		}
		if b.Length > total {
			return nil, streamErr("RAM block %q of %d bytes exceeds the announced total", name, b.Length)
		}
		total -= b.Length
		blocks = append(blocks, b)
		if len(blocks) > 1024 {
			return nil, streamErr("more than 1024 RAM blocks")
		}
	}
	return blocks, nil
}

// record reads one record of a "ram" section. A MEM_SIZE record comes back
// with its total in Offset; the caller reads the block list.
func (s *streamReader) record() (ramRecord, error) {
	v, err := s.be64()
	if err != nil {
		return ramRecord{}, err
	}
	rec := ramRecord{Flags: v & ramFlagMask, Offset: v &^ ramFlagMask}
	flags := rec.Flags &^ ramFlagContinue
	switch flags {
	case ramFlagMemSize, ramFlagEOS:
		return rec, nil
	case ramFlagZero, ramFlagPage:
	default:
		return rec, streamErr("RAM record flags %#x at byte %d (compression, xbzrle and RDMA are not supported)", rec.Flags, s.n-8)
	}
	if rec.Flags&ramFlagContinue != 0 {
		if s.last == "" {
			return rec, streamErr("RAM record continues no block at byte %d", s.n-8)
		}
		rec.Block = s.last
	} else {
		if rec.Block, err = s.str8(); err != nil {
			return rec, err
		}
		s.last = rec.Block
	}
	if flags == ramFlagZero {
		rec.Fill, err = s.u8()
		return rec, err
	}
	rec.Data = s.page
	return rec, s.full(s.page)
}

// streamWriter writes a migration stream.
type streamWriter struct {
	w    *bufio.Writer
	n    int64
	err  error
	last string // block of the previous page record written (CONTINUE)
	tmp  [8]byte
}

func newStreamWriter(w io.Writer) *streamWriter {
	return &streamWriter{w: bufio.NewWriterSize(w, 256<<10)}
}

func (w *streamWriter) write(p []byte) {
	if w.err != nil {
		return
	}
	k, err := w.w.Write(p)
	w.n += int64(k)
	w.err = err
}

func (w *streamWriter) u8(b byte) { w.write([]byte{b}) }

func (w *streamWriter) be32(v uint32) {
	binary.BigEndian.PutUint32(w.tmp[:4], v)
	w.write(w.tmp[:4])
}

func (w *streamWriter) be64(v uint64) {
	binary.BigEndian.PutUint64(w.tmp[:8], v)
	w.write(w.tmp[:8])
}

func (w *streamWriter) str8(s string) {
	if len(s) > 255 {
		if w.err == nil {
			w.err = streamErr("name %q too long", s)
		}
		return
	}
	w.u8(byte(len(s)))
	w.write([]byte(s))
}

func (w *streamWriter) flush() error {
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}

func (w *streamWriter) header() {
	w.be32(streamMagic)
	w.be32(streamVersion)
}

// config writes a configuration section, type byte included.
func (w *streamWriter) config(c streamConfig) {
	w.u8(secConfiguration)
	w.be32(uint32(len(c.Machine)))
	w.write([]byte(c.Machine))
	if c.TargetPageBits != nil {
		w.u8(secSubsection)
		w.str8("configuration/target-page-bits")
		w.be32(1)
		w.be32(*c.TargetPageBits)
	}
	if len(c.Caps) > 0 {
		w.u8(secSubsection)
		w.str8("configuration/capabilities")
		w.be32(1)
		w.be32(uint32(len(c.Caps)))
		for _, cp := range c.Caps {
			w.str8(cp)
		}
	}
	if c.UUID != nil {
		w.u8(secSubsection)
		w.str8("configuration/uuid")
		w.be32(1)
		w.write(c.UUID)
	}
}

func (w *streamWriter) sectionHeader(h sectionHeader) {
	w.u8(h.Type)
	w.be32(h.ID)
	if h.Type == secStart || h.Type == secFull {
		w.str8(h.Name)
		w.be32(h.Instance)
		w.be32(h.Version)
	}
}

func (w *streamWriter) footer(id uint32) {
	w.u8(secFooter)
	w.be32(id)
}

// blockList writes a MEM_SIZE record and its block list.
func (w *streamWriter) blockList(blocks []ramBlockInfo, ignoreShared bool) {
	var total uint64
	for _, b := range blocks {
		total += b.Length
	}
	w.be64(total | ramFlagMemSize)
	for _, b := range blocks {
		w.str8(b.Name)
		w.be64(b.Length)
		if ignoreShared {
			w.be64(b.Addr)
		}
	}
}

// page writes a PAGE record, or a ZERO record for a page of zeros.
func (w *streamWriter) page(block string, offset uint64, data []byte) {
	if fsutil.IsZero(data) {
		w.pageHeader(block, offset, ramFlagZero)
		w.u8(0)
		return
	}
	w.pageHeader(block, offset, ramFlagPage)
	w.write(data)
}

func (w *streamWriter) pageHeader(block string, offset, flags uint64) {
	if block == w.last {
		w.be64(offset | flags | ramFlagContinue)
		return
	}
	w.be64(offset | flags)
	w.str8(block)
	w.last = block
}

func (w *streamWriter) eos() { w.be64(ramFlagEOS) }

// streamSummary describes a stream's structure (tests and debugging).
type streamSummary struct {
	Config     *streamConfig
	RAMID      uint32
	Blocks     []ramBlockInfo
	Pages      map[string]int // page records per block (PAGE and ZERO)
	Sections   []sectionHeader
	DeviceTail int64 // bytes from the first device section on
}

// summarizeStream reads a stream up to its device sections.
func summarizeStream(r io.Reader) (*streamSummary, error) {
	sr := newStreamReader(r)
	if err := sr.header(); err != nil {
		return nil, err
	}
	sum := &streamSummary{Pages: map[string]int{}}
	ignoreShared := false
	for {
		t, err := sr.u8()
		if err != nil {
			return sum, err
		}
		switch t {
		case secConfiguration:
			c, err := sr.config()
			if err != nil {
				return sum, err
			}
			sum.Config = &c
			ignoreShared = c.ignoreShared()
		case secStart, secPart, secEnd:
			h, err := sr.sectionHeader(t)
			if err != nil {
				return sum, err
			}
			sum.Sections = append(sum.Sections, h)
			if t == secStart {
				if h.Name != ramSectionName {
					return sum, streamErr("start section %q", h.Name)
				}
				sum.RAMID = h.ID
			}
			for {
				rec, err := sr.record()
				if err != nil {
					return sum, err
				}
				flags := rec.Flags &^ ramFlagContinue
				if flags == ramFlagEOS {
					break
				}
				if flags == ramFlagMemSize {
					if sum.Blocks, err = sr.blockList(rec.Offset, ignoreShared); err != nil {
						return sum, err
					}
					continue
				}
				sum.Pages[rec.Block]++
			}
			if _, err := sr.footer(h.ID); err != nil {
				return sum, err
			}
		case secFull, secEOF:
			sum.Sections = append(sum.Sections, sectionHeader{Type: t})
			k, err := io.Copy(io.Discard, sr.r)
			sum.DeviceTail = k + 1
			return sum, err
		default:
			return sum, streamErr("section type %#x at byte %d", t, sr.n-1)
		}
	}
}
