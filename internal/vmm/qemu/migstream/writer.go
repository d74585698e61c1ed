package migstream

import (
	"bufio"
	"encoding/binary"
	"io"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// Writer writes a migration stream. Its methods write one element each
// and return nothing: the first error sticks, and Flush returns it.
type Writer struct {
	w    *bufio.Writer
	n    int64
	err  error
	last string // block of the previous page record written (CONTINUE)
	tmp  [8]byte
}

// NewWriter returns a Writer to w, which it buffers: call Flush at the
// end.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 256<<10)}
}

// Reset makes w write to dst as a new Writer would, reusing its buffer:
// what w has not flushed, its error, its offset and the block of its last
// record are dropped.
func (w *Writer) Reset(dst io.Writer) {
	w.w.Reset(dst)
	w.n, w.err, w.last = 0, nil, ""
}

// ContinueFrom makes w's records follow prev's, as when w's bytes come
// right after prev's in one stream: a page record of the block prev wrote
// last continues it (CONTINUE) instead of naming it again.
func (w *Writer) ContinueFrom(prev *Writer) { w.last = prev.last }

// Offset returns the number of bytes written so far, flushed or not.
func (w *Writer) Offset() int64 { return w.n }

// Write writes p as it is: device sections, or records another Writer
// wrote. It implements [io.Writer].
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	k, err := w.w.Write(p)
	w.n += int64(k)
	w.err = err
	return k, err
}

// WriteByte writes one byte as it is, such as the type of a section
// whose content follows through Write. It implements [io.ByteWriter].
func (w *Writer) WriteByte(b byte) error {
	w.u8(b)
	return w.err
}

func (w *Writer) write(p []byte) { w.Write(p) }

func (w *Writer) u8(b byte) { w.write([]byte{b}) }

func (w *Writer) be32(v uint32) {
	binary.BigEndian.PutUint32(w.tmp[:4], v)
	w.write(w.tmp[:4])
}

func (w *Writer) be64(v uint64) {
	binary.BigEndian.PutUint64(w.tmp[:8], v)
	w.write(w.tmp[:8])
}

func (w *Writer) str8(s string) {
	if len(s) > 255 {
		if w.err == nil {
			w.err = errorf("name %q too long", s)
		}
		return
	}
	w.u8(byte(len(s)))
	w.write([]byte(s))
}

// Flush writes out what w buffers, and returns the first error of any
// write.
func (w *Writer) Flush() error {
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}

// Header writes the magic and version.
func (w *Writer) Header() {
	w.be32(Magic)
	w.be32(Version)
}

// Config writes a configuration section, type byte included.
func (w *Writer) Config(c Config) {
	w.u8(SectionConfiguration)
	w.be32(uint32(len(c.Machine)))
	w.write([]byte(c.Machine))
	if c.TargetPageBits != nil {
		w.u8(SectionSubsection)
		w.str8("configuration/target-page-bits")
		w.be32(1)
		w.be32(*c.TargetPageBits)
	}
	if len(c.Caps) > 0 {
		w.u8(SectionSubsection)
		w.str8("configuration/capabilities")
		w.be32(1)
		w.be32(uint32(len(c.Caps)))
		for _, cp := range c.Caps {
			w.str8(cp)
		}
	}
	if c.UUID != nil {
		w.u8(SectionSubsection)
		w.str8("configuration/uuid")
		w.be32(1)
		w.write(c.UUID)
	}
}

// SectionHeader writes a section header, type byte included.
func (w *Writer) SectionHeader(h SectionHeader) {
	w.u8(h.Type)
	w.be32(h.ID)
	if h.Type == SectionStart || h.Type == SectionFull {
		w.str8(h.Name)
		w.be32(h.Instance)
		w.be32(h.Version)
	}
}

// Footer writes the footer of section id.
func (w *Writer) Footer(id uint32) {
	w.u8(SectionFooter)
	w.be32(id)
}

// BlockList writes a MEM_SIZE record and its block list, with guest
// addresses if ignoreShared.
func (w *Writer) BlockList(blocks []BlockInfo, ignoreShared bool) {
	var total uint64
	for _, b := range blocks {
		total += b.Length
	}
	w.be64(total | FlagMemSize)
	for _, b := range blocks {
		w.str8(b.Name)
		w.be64(b.Length)
		if ignoreShared {
			w.be64(b.Addr)
		}
	}
}

// Page writes a PAGE record of data (PageSize bytes) at offset in block,
// or a ZERO record if data is all zeros.
func (w *Writer) Page(block string, offset uint64, data []byte) {
	if fsutil.IsZero(data) {
		w.pageHeader(block, offset, FlagZero)
		w.u8(0)
		return
	}
	w.pageHeader(block, offset, FlagPage)
	w.write(data)
}

// Record writes a ZERO or PAGE record as it is: a PAGE record of zeros
// stays one. Whether it names its block or continues the previous
// record's (FlagContinue) is the Writer's choice, not rec's.
func (w *Writer) Record(rec Record) {
	switch rec.Flags &^ FlagContinue {
	case FlagZero:
		w.pageHeader(rec.Block, rec.Offset, FlagZero)
		w.u8(rec.Fill)
	case FlagPage:
		if len(rec.Data) != PageSize && w.err == nil {
			w.err = errorf("PAGE record of %d bytes", len(rec.Data))
			return
		}
		w.pageHeader(rec.Block, rec.Offset, FlagPage)
		w.write(rec.Data)
	default:
		if w.err == nil {
			w.err = errorf("RAM record flags %#x: not a page record", rec.Flags)
		}
	}
}

func (w *Writer) pageHeader(block string, offset, flags uint64) {
	if block == w.last {
		w.be64(offset | flags | FlagContinue)
		return
	}
	w.be64(offset | flags)
	w.str8(block)
	w.last = block
}

// EOS writes the record that ends a "ram" section's records.
func (w *Writer) EOS() { w.be64(FlagEOS) }

// VMDescription writes the JSON description that follows SectionEOF at
// the end of a stream: loaders read and ignore it.
func (w *Writer) VMDescription(json []byte) {
	w.u8(SectionVMDescription)
	w.be32(uint32(len(json)))
	w.write(json)
}
