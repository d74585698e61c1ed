package migstream

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Reader reads a migration stream one element at a time. It checks each
// element's own lengths, not the order of the sections, which is its
// caller's to follow.
type Reader struct {
	r    *bufio.Reader
	n    int64 // bytes consumed
	page []byte
	last string // block of the previous page record (CONTINUE)
}

// NewReader returns a Reader of the stream r, which it buffers.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 1<<20), page: make([]byte, PageSize)}
}

// Offset returns the number of bytes read so far: the offset in the
// stream of the next byte.
func (s *Reader) Offset() int64 { return s.n }

// Read reads the stream's bytes as they are, for what the Reader cannot
// parse: the device sections, from the first SectionFull or SectionEOF
// on, which a converter copies byte for byte.
func (s *Reader) Read(p []byte) (int, error) {
	k, err := s.r.Read(p)
	s.n += int64(k)
	return k, err
}

func (s *Reader) full(p []byte) error {
	k, err := io.ReadFull(s.r, p)
	s.n += int64(k)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w at byte %d: %w", ErrFormat, s.n, err)
	}
	return nil
}

func (s *Reader) u8() (byte, error) {
	b, err := s.r.ReadByte()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, fmt.Errorf("%w at byte %d: %w", ErrFormat, s.n, err)
	}
	s.n++
	return b, nil
}

func (s *Reader) be32() (uint32, error) {
	var b [4]byte
	if err := s.full(b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b[:]), nil
}

func (s *Reader) be64() (uint64, error) {
	var b [8]byte
	if err := s.full(b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

func (s *Reader) str8() (string, error) {
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

func (s *Reader) peek() (byte, error) {
	b, err := s.r.Peek(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

// Header reads and checks the magic and version.
func (s *Reader) Header() error {
	m, err := s.be32()
	if err != nil {
		return err
	}
	v, err := s.be32()
	if err != nil {
		return err
	}
	if m != Magic || v != Version {
		return errorf("magic %#x version %d, want QEVM version %d", m, v, Version)
	}
	return nil
}

// SectionType reads the byte that starts the next section. A stream that
// ends here is truncated: the error wraps [io.ErrUnexpectedEOF].
func (s *Reader) SectionType() (byte, error) { return s.u8() }

// Config reads the configuration section after its type byte.
func (s *Reader) Config() (Config, error) {
	var c Config
	n, err := s.be32()
	if err != nil {
		return c, err
	}
	if n > 256 {
		return c, errorf("machine name of %d bytes", n)
	}
	name := make([]byte, n)
	if err := s.full(name); err != nil {
		return c, err
	}
	c.Machine = string(name)
	for {
		b, err := s.peek()
		if err != nil || b != SectionSubsection {
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
				return c, errorf("%d capabilities", count)
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
			return c, errorf("unknown configuration subsection %q", sub)
		}
	}
}

// SectionHeader reads a section header after its type byte t.
func (s *Reader) SectionHeader(t byte) (SectionHeader, error) {
	h := SectionHeader{Type: t}
	var err error
	if h.ID, err = s.be32(); err != nil {
		return h, err
	}
	if t == SectionStart || t == SectionFull {
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

// Footer reads the footer of section id if there is one, and reports
// whether it was there.
func (s *Reader) Footer(id uint32) (bool, error) {
	b, err := s.peek()
	if err != nil || b != SectionFooter {
		return false, nil
	}
	s.u8()
	got, err := s.be32()
	if err != nil {
		return false, err
	}
	if got != id {
		return false, errorf("footer of section %d closes section %d", got, id)
	}
	return true, nil
}

// BlockList reads the block list of a MEM_SIZE record of total bytes
// (its Offset). With ignoreShared ([Config.IgnoreShared]) each entry
// carries a guest address.
func (s *Reader) BlockList(total uint64, ignoreShared bool) ([]BlockInfo, error) {
	var blocks []BlockInfo
	for total > 0 {
		name, err := s.str8()
		if err != nil {
			return nil, err
		}
		b := BlockInfo{Name: name}
		if b.Length, err = s.be64(); err != nil {
			return nil, err
		}
		if ignoreShared {
			if b.Addr, err = s.be64(); err != nil {
				return nil, err
			}
		}
		if b.Length > total {
			return nil, errorf("RAM block %q of %d bytes exceeds the announced total", name, b.Length)
		}
		total -= b.Length
		blocks = append(blocks, b)
		if len(blocks) > 1024 {
			return nil, errorf("more than 1024 RAM blocks")
		}
	}
	return blocks, nil
}

// Record reads one record of a "ram" section. A MEM_SIZE record comes
// back with its total in Offset; the caller reads the block list
// ([Reader.BlockList]). A record that continues the previous one's block
// comes back with that block's name. Compressed, XBZRLE and RDMA records
// are not supported.
func (s *Reader) Record() (Record, error) {
	v, err := s.be64()
	if err != nil {
		return Record{}, err
	}
	rec := Record{Flags: v & flagMask, Offset: v &^ flagMask}
	flags := rec.Flags &^ FlagContinue
	switch flags {
	case FlagMemSize, FlagEOS:
		return rec, nil
	case FlagZero, FlagPage:
	default:
		return rec, errorf("RAM record flags %#x at byte %d (compression, xbzrle and RDMA are not supported)", rec.Flags, s.n-8)
	}
	if rec.Flags&FlagContinue != 0 {
		if s.last == "" {
			return rec, errorf("RAM record continues no block at byte %d", s.n-8)
		}
		rec.Block = s.last
	} else {
		if rec.Block, err = s.str8(); err != nil {
			return rec, err
		}
		s.last = rec.Block
	}
	if flags == FlagZero {
		rec.Fill, err = s.u8()
		return rec, err
	}
	rec.Data = s.page
	return rec, s.full(s.page)
}
