package qemu

// Splitting a migration stream (package migstream) into a memory file and
// a state file, for live branches (branch_live.go), and the sparse memory
// file writer that branches of every mode use.

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/vmm/qemu/migstream"
)

const (
	// memBlockName is the RAM block of guest memory: the id of the
	// memory-backend object the driver creates (args.go).
	memBlockName = "mem"

	// pageSize is the guest's page size, that of the stream's page
	// records and of the host pages the branch code copies.
	pageSize = migstream.PageSize
)

// streamErr is an error about a migration stream's content: it wraps
// migstream.ErrFormat, like the errors of the stream's reader.
func streamErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", migstream.ErrFormat, fmt.Sprintf(format, args...))
}

// Bounds on what a migration stream from QEMU may ask this process to
// hold or write, beyond guest memory (which is the machine's size).
const (
	// maxOtherRAMBytes bounds the RAM blocks other than guest memory:
	// microvm's firmware and ACPI tables are well under 1 MiB, and a
	// device with video memory would bring tens of MiB.
	maxOtherRAMBytes = 256 << 20
	// sectionSlackBytes is what a section keeps beyond its pages: the
	// block list (at most 1024 entries of at most 272 bytes) and record
	// headers.
	sectionSlackBytes = 1 << 20
	// maxDeviceStateBytes bounds the device state: that of microvm's
	// virtio devices is tens of KiB, and QEMU's JSON description of it
	// about as much.
	maxDeviceStateBytes = 64 << 20
)

// checkBlockList checks a stream's RAM block list against the machine:
// memBlock has exactly its memory size, the others together at most
// maxOtherRAMBytes, no name twice. It returns the blocks' lengths and the
// others' total.
func checkBlockList(blocks []migstream.BlockInfo, memBlock string, memSize int64) (lengths map[string]uint64, other uint64, err error) {
	lengths = make(map[string]uint64, len(blocks))
	for _, b := range blocks {
		if _, dup := lengths[b.Name]; dup {
			return nil, 0, streamErr("RAM block %q listed twice in the block list", b.Name)
		}
		lengths[b.Name] = b.Length
		if b.Name == memBlock {
			if b.Length != uint64(memSize) {
				return nil, 0, streamErr("RAM block %q is %d bytes in the block list, but the machine's memory is %d", b.Name, b.Length, memSize)
			}
			continue
		}
		other += b.Length
	}
	if _, ok := lengths[memBlock]; !ok {
		return nil, 0, streamErr("no RAM block %q in the stream (block list %v)", memBlock, blocks)
	}
	if other > maxOtherRAMBytes {
		return nil, 0, streamErr("RAM blocks other than %q of %d bytes in all, more than %d", memBlock, other, uint64(maxOtherRAMBytes))
	}
	return lengths, other, nil
}

// checkPage checks that a page record read at byte at names a block of
// the block list (lengths; nil before it) and an offset inside it.
func checkPage(rec migstream.Record, at int64, lengths map[string]uint64) error {
	if lengths == nil {
		return streamErr("page record at byte %d (RAM block %q) before the block list", at, rec.Block)
	}
	n, ok := lengths[rec.Block]
	switch {
	case !ok:
		return streamErr("page record at byte %d: RAM block %q is not in the block list", at, rec.Block)
	case rec.Offset >= n:
		return streamErr("page record at byte %d: offset %#x past the end of RAM block %q (%d bytes)", at, rec.Offset, rec.Block, n)
	}
	return nil
}

// memWriter writes guest pages into a sparse memory file, coalescing
// neighbouring pages into one write and leaving zero pages as holes.
//
// Without base the file starts empty (all holes) and a zero page that was
// never written needs nothing. With base the file starts as a copy of
// other data, and every zero page is punched out.
type memWriter struct {
	f       *os.File
	size    int64
	base    bool
	buf     []byte
	bufOff  int64 // file offset of buf[0]
	holeOff int64 // pending hole to punch
	holeLen int64
	written []uint64
	pages   int64 // pages written with data (and not zeroed since)
	bytes   int64 // bytes written
}

func newMemWriter(f *os.File, size int64, base bool) *memWriter {
	return &memWriter{f: f, size: size, base: base, buf: make([]byte, 0, 1<<20), written: make([]uint64, (size/pageSize+63)/64)}
}

func (m *memWriter) mark(off int64, on bool) (was bool) {
	i := off / pageSize
	was = m.written[i/64]&(1<<(i%64)) != 0
	if on {
		m.written[i/64] |= 1 << (i % 64)
	} else {
		m.written[i/64] &^= 1 << (i % 64)
	}
	switch {
	case on && !was:
		m.pages++
	case !on && was:
		m.pages--
	}
	return was
}

func (m *memWriter) check(off int64, n int) error {
	// off > m.size first: off+n could overflow.
	if off < 0 || off%pageSize != 0 || n%pageSize != 0 || off > m.size || int64(n) > m.size-off {
		return streamErr("guest pages %#x+%#x outside the %d-byte memory block", off, n, m.size)
	}
	return nil
}

// put writes whole pages of data at off; zero pages become holes.
func (m *memWriter) put(off int64, data []byte) error {
	if err := m.check(off, len(data)); err != nil {
		return err
	}
	for p := 0; p < len(data); {
		if fsutil.IsZero(data[p : p+pageSize]) {
			if err := m.zero(off + int64(p)); err != nil {
				return err
			}
			p += pageSize
			continue
		}
		// A run of pages with data.
		q := p + pageSize
		for q < len(data) && !fsutil.IsZero(data[q:q+pageSize]) {
			q += pageSize
		}
		if err := m.data(off+int64(p), data[p:q]); err != nil {
			return err
		}
		p = q
	}
	return nil
}

// data writes a run of non-zero pages.
func (m *memWriter) data(off int64, run []byte) error {
	for p := 0; p < len(run); p += pageSize {
		m.mark(off+int64(p), true)
	}
	if err := m.flushHole(); err != nil {
		return err
	}
	if len(m.buf) > 0 && (m.bufOff+int64(len(m.buf)) != off || len(m.buf)+len(run) > cap(m.buf)) {
		if err := m.flushData(); err != nil {
			return err
		}
	}
	if len(run) >= cap(m.buf)/4 {
		// Large enough to write as it is.
		if err := m.flushData(); err != nil {
			return err
		}
		_, err := m.f.WriteAt(run, off)
		m.bytes += int64(len(run))
		return err
	}
	if len(m.buf) == 0 {
		m.bufOff = off
	}
	m.buf = append(m.buf, run...)
	return nil
}

// zero makes the page at off read as zeros: a hole.
func (m *memWriter) zero(off int64) error {
	if err := m.check(off, pageSize); err != nil {
		return err
	}
	if !m.mark(off, false) && !m.base {
		return nil // never written: already a hole
	}
	if err := m.flushData(); err != nil {
		return err
	}
	if m.holeLen > 0 && m.holeOff+m.holeLen == off {
		m.holeLen += pageSize
		return nil
	}
	if err := m.flushHole(); err != nil {
		return err
	}
	m.holeOff, m.holeLen = off, pageSize
	return nil
}

// fill writes a page of one repeated byte.
func (m *memWriter) fill(off int64, b byte) error {
	if b == 0 {
		return m.zero(off)
	}
	return m.put(off, bytes.Repeat([]byte{b}, pageSize))
}

func (m *memWriter) flushData() error {
	if len(m.buf) == 0 {
		return nil
	}
	_, err := m.f.WriteAt(m.buf, m.bufOff)
	m.bytes += int64(len(m.buf))
	m.buf = m.buf[:0]
	return err
}

func (m *memWriter) flushHole() error {
	if m.holeLen == 0 {
		return nil
	}
	off, n := m.holeOff, m.holeLen
	m.holeLen = 0
	return unix.Fallocate(int(m.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

func (m *memWriter) flush() error {
	if err := m.flushData(); err != nil {
		return err
	}
	return m.flushHole()
}

// splitStats describes a split stream.
type splitStats struct {
	StreamBytes int64 // read
	StateBytes  int64 // written to the state file
	MemPages    int64 // pages of the memory block with data (not holes)
	MemBytes    int64 // bytes written to the memory file
	ZeroPages   int64 // zero records of the memory block
	OtherPages  int64 // page records of other blocks (ROMs), kept in the state
	Blocks      []migstream.BlockInfo
	Config      migstream.Config
}

// splitStream turns a migration stream with guest RAM in it into what a
// template is: a memory file (the page records of RAM block memBlock at
// their offsets, zero pages as holes; mem must be an empty file, which is
// sized here) and a small state file (the rest, byte for byte, except that
// the page records of memBlock are left out). A QEMU with that memory file
// mapped loads the state file with x-ignore-shared like a template's: the
// block list still names memBlock, but no page of it follows.
//
// The stream comes from QEMU, which a guest may have taken over: every
// length and offset in it is checked before it sizes anything. memSize is
// the machine's memory, which memBlock must be; the other blocks
// (firmware, ACPI tables) together may be maxOtherRAMBytes, their pages
// kept in one section twice their size, the device state
// maxDeviceStateBytes.
func splitStream(r io.Reader, mem *os.File, state io.Writer, memBlock string, memSize int64) (st splitStats, err error) {
	sr := migstream.NewReader(r)
	sw := migstream.NewWriter(state)
	defer func() {
		st.StreamBytes = sr.Offset()
		st.StateBytes = sw.Offset()
	}()
	if err := sr.Header(); err != nil {
		return st, err
	}
	sw.Header()
	var (
		mw       *memWriter
		ramID    uint32
		haveRAM  bool
		lengths  map[string]uint64 // of the RAM blocks, from the block list
		other    uint64            // bytes of the blocks other than memBlock
		sect     bytes.Buffer      // the records a section keeps
		sectW    = migstream.NewWriter(&sect)
		finished bool
	)
	for !finished {
		t, err := sr.SectionType()
		if err != nil {
			return st, err
		}
		switch t {
		case migstream.SectionConfiguration:
			if st.Config, err = sr.Config(); err != nil {
				return st, err
			}
			sw.Config(st.Config)
		case migstream.SectionStart, migstream.SectionPart, migstream.SectionEnd:
			h, err := sr.SectionHeader(t)
			if err != nil {
				return st, err
			}
			switch {
			case t == migstream.SectionStart && h.Name == migstream.RAMSection && !haveRAM:
				if h.Version != migstream.RAMSectionVersion {
					return st, streamErr("ram section version %d, want %d", h.Version, migstream.RAMSectionVersion)
				}
				ramID, haveRAM = h.ID, true
			case t != migstream.SectionStart && haveRAM && h.ID == ramID:
			default:
				return st, streamErr("section %d (%q, type %d): only the ram handler's iterative sections are supported", h.ID, h.Name, t)
			}
			// The records the section keeps go to sect first: a part
			// section with none of them is left out.
			sect.Reset()
			sectW.Reset(&sect)
			sectW.ContinueFrom(sw)
			kept := false
			for {
				at := sr.Offset()
				rec, err := sr.Record()
				if err != nil {
					return st, err
				}
				flags := rec.Flags &^ migstream.FlagContinue
				if flags == migstream.FlagEOS {
					break
				}
				if flags == migstream.FlagMemSize {
					if rec.Offset > uint64(memSize)+maxOtherRAMBytes {
						return st, streamErr("RAM total (MEM_SIZE record at byte %d) of %d bytes: more than the machine's %d bytes of memory and %d of other blocks",
							at, rec.Offset, memSize, uint64(maxOtherRAMBytes))
					}
					blocks, err := sr.BlockList(rec.Offset, st.Config.IgnoreShared())
					if err != nil {
						return st, err
					}
					st.Blocks = blocks
					if lengths, other, err = checkBlockList(blocks, memBlock, memSize); err != nil {
						return st, err
					}
					if fi, err := mem.Stat(); err != nil || fi.Size() != 0 {
						return st, fmt.Errorf("memory file %s is not empty (%v)", mem.Name(), err)
					}
					if err := mem.Truncate(memSize); err != nil {
						return st, err
					}
					mw = newMemWriter(mem, memSize, false)
					sectW.BlockList(blocks, st.Config.IgnoreShared())
					kept = true
					continue
				}
				if err := checkPage(rec, at, lengths); err != nil {
					return st, err
				}
				if rec.Block == memBlock {
					if flags == migstream.FlagZero {
						st.ZeroPages++
						err = mw.fill(int64(rec.Offset), rec.Fill)
					} else {
						err = mw.put(int64(rec.Offset), rec.Data)
					}
					if err != nil {
						return st, err
					}
					continue
				}
				st.OtherPages++
				kept = true
				sectW.Record(rec)
				if n := sectW.Offset(); uint64(n) > 2*other+sectionSlackBytes {
					return st, streamErr("section %d keeps %d bytes of pages of RAM blocks other than %q, more than twice their %d bytes: a page sent over and over",
						h.ID, n, memBlock, other)
				}
			}
			hasFooter, err := sr.Footer(h.ID)
			if err != nil {
				return st, err
			}
			if !kept && t == migstream.SectionPart {
				continue // nothing left of it
			}
			if err := sectW.Flush(); err != nil {
				return st, err
			}
			sw.SectionHeader(h)
			sw.Write(sect.Bytes())
			sw.ContinueFrom(sectW)
			sw.EOS()
			if hasFooter {
				sw.Footer(h.ID)
			}
		case migstream.SectionFull, migstream.SectionEOF:
			// Device state from here on, in a form only QEMU can read:
			// copy it as it is.
			from := sr.Offset() - 1
			sw.WriteByte(t)
			_, err := io.CopyN(sw, sr, maxDeviceStateBytes+1)
			if err == nil {
				return st, streamErr("device state (from byte %d) longer than %d bytes", from, maxDeviceStateBytes)
			}
			if err != io.EOF {
				return st, err
			}
			finished = true
		default:
			return st, streamErr("section type %#x at byte %d", t, sr.Offset()-1)
		}
	}
	if mw == nil {
		return st, streamErr("no RAM in the stream")
	}
	if err := mw.flush(); err != nil {
		return st, err
	}
	st.MemPages, st.MemBytes = mw.pages, mw.bytes
	return st, sw.Flush()
}
