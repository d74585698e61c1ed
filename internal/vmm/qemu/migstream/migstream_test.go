package migstream

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// page returns a page filled with b.
func page(b byte) []byte { return bytes.Repeat([]byte{b}, PageSize) }

// writeSmall writes a stream with every kind of element a Writer writes
// but data pages: all three configuration subsections, a block list with
// guest addresses, ZERO records (one of a fill byte) that continue their
// block within and across sections, a section without footer, EOF.
func writeSmall(w *Writer) {
	bits := uint32(12)
	w.Header()
	w.Config(Config{Machine: "microvm", Caps: []string{CapIgnoreShared}, TargetPageBits: &bits, UUID: []byte("0123456789abcdef")})
	w.SectionHeader(SectionHeader{Type: SectionStart, ID: 2, Name: RAMSection, Version: RAMSectionVersion})
	w.BlockList([]BlockInfo{{Name: "mem", Length: 2 * PageSize}, {Name: "rom", Length: PageSize, Addr: 0xfffff000}}, true)
	w.EOS()
	w.Footer(2)
	w.SectionHeader(SectionHeader{Type: SectionPart, ID: 2})
	w.Page("mem", 0, make([]byte, PageSize))
	w.Page("mem", PageSize, make([]byte, PageSize))
	w.Page("rom", 0, make([]byte, PageSize))
	w.EOS()
	w.Footer(2)
	w.SectionHeader(SectionHeader{Type: SectionEnd, ID: 2})
	w.Record(Record{Flags: FlagZero, Block: "rom", Fill: 7})
	w.EOS()
	w.WriteByte(SectionEOF)
}

// smallStream is what writeSmall wrote before the codec moved into this
// package (from internal/vmm/qemu/stream.go): the encoding must not
// change.
const smallStream = "" +
	"5145564d00000003" + // header
	"07000000076d6963726f766d" + // configuration "microvm"
	"051e636f6e66696775726174696f6e2f7461726765742d706167652d62697473000000010000000c" + // target-page-bits 12
	"051a636f6e66696775726174696f6e2f6361706162696c697469657300000001000000010f782d69676e6f72652d736861726564" + // capabilities: x-ignore-shared
	"0512636f6e66696775726174696f6e2f757569640000000130313233343536373839616263646566" + // uuid
	"01000000020372616d0000000000000004" + // start section 2 "ram" 0 version 4
	"0000000000003004" + // MEM_SIZE 3 pages
	"036d656d00000000000020000000000000000000" + // mem, 2 pages at 0
	"03726f6d000000000000100000000000fffff000" + // rom, 1 page at 0xfffff000
	"00000000000000107e00000002" + // EOS, footer
	"0200000002" + // part section 2
	"0000000000000002036d656d00" + // ZERO mem 0, fill 0
	"000000000000102200" + // ZERO|CONTINUE 0x1000, fill 0
	"000000000000000203726f6d00" + // ZERO rom 0, fill 0
	"00000000000000107e00000002" + // EOS, footer
	"0300000002" + // end section 2
	"000000000000002207" + // ZERO|CONTINUE 0, fill 7
	"0000000000000010" + // EOS, no footer
	"00" // EOF

func TestWriterEncoding(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	writeSmall(w)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(buf.Bytes()); got != smallStream {
		t.Errorf("stream\n got %s\nwant %s", got, smallStream)
	}
	if w.Offset() != int64(buf.Len()) {
		t.Errorf("Offset %d, wrote %d bytes", w.Offset(), buf.Len())
	}

	// Data pages, CONTINUE and no guest addresses, by hash (also from
	// before the move).
	buf.Reset()
	w = NewWriter(&buf)
	w.Header()
	w.Config(Config{Machine: "pc-q35-7.2"})
	w.SectionHeader(SectionHeader{Type: SectionStart, ID: 3, Name: RAMSection, Instance: 1, Version: RAMSectionVersion})
	w.BlockList([]BlockInfo{{Name: "pc.ram", Length: 3 * PageSize}}, false)
	w.Page("pc.ram", 0, page(1))
	w.Page("pc.ram", PageSize, page(2))
	w.EOS()
	w.Footer(3)
	w.SectionHeader(SectionHeader{Type: SectionPart, ID: 3})
	w.Page("pc.ram", 2*PageSize, page(3))
	w.EOS()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	const want = "0ba969911574252f669f90f33f0a5dbc9cbc08f58350fc0842e93e2355ee46e5"
	if got := fmt.Sprintf("%x", sha256.Sum256(buf.Bytes())); got != want || buf.Len() != 12408 {
		t.Errorf("stream of %d bytes, sha256 %s; want 12408 bytes, %s", buf.Len(), got, want)
	}
}

// copyStream reads a stream element by element and writes each element
// again, the device sections as they are.
func copyStream(t *testing.T, stream []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	r, w := NewReader(bytes.NewReader(stream)), NewWriter(&out)
	if err := r.Header(); err != nil {
		t.Fatal(err)
	}
	w.Header()
	var cfg Config
	for {
		ty, err := r.SectionType()
		if err != nil {
			t.Fatal(err)
		}
		switch ty {
		case SectionConfiguration:
			if cfg, err = r.Config(); err != nil {
				t.Fatal(err)
			}
			w.Config(cfg)
			continue
		case SectionStart, SectionPart, SectionEnd:
		default:
			w.WriteByte(ty)
			if _, err := io.Copy(w, r); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if r.Offset() != int64(len(stream)) || w.Offset() != int64(out.Len()) {
				t.Errorf("offsets: read %d of %d, wrote %d of %d", r.Offset(), len(stream), w.Offset(), out.Len())
			}
			return out.Bytes()
		}
		h, err := r.SectionHeader(ty)
		if err != nil {
			t.Fatal(err)
		}
		w.SectionHeader(h)
		for {
			rec, err := r.Record()
			if err != nil {
				t.Fatal(err)
			}
			switch rec.Flags &^ FlagContinue {
			case FlagEOS:
				w.EOS()
			case FlagMemSize:
				blocks, err := r.BlockList(rec.Offset, cfg.IgnoreShared())
				if err != nil {
					t.Fatal(err)
				}
				w.BlockList(blocks, cfg.IgnoreShared())
				continue
			default:
				w.Record(rec)
				continue
			}
			break
		}
		ok, err := r.Footer(h.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			w.Footer(h.ID)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	small, _ := hex.DecodeString(smallStream)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Header()
	w.Config(Config{Machine: "microvm"})
	w.SectionHeader(SectionHeader{Type: SectionStart, ID: 2, Name: RAMSection, Version: RAMSectionVersion})
	w.BlockList([]BlockInfo{{Name: "mem", Length: 4 * PageSize}}, false)
	w.Page("mem", 0, page(1))
	w.Record(Record{Flags: FlagPage, Block: "mem", Offset: PageSize, Data: make([]byte, PageSize)}) // a PAGE of zeros stays one
	w.EOS()
	w.Footer(2)
	w.WriteByte(SectionFull)
	w.Write([]byte("\x00\x00\x00\x03\x05timer opaque device state\x7e\x00\x00\x00\x03\x00"))
	w.VMDescription([]byte(`{"devices":[]}`))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string][]byte{"small": small, "device state": buf.Bytes()} {
		if got := copyStream(t, s); !bytes.Equal(got, s) {
			t.Errorf("%s: copy differs:\n got %x\nwant %x", name, got, s)
		}
	}
}

func TestSummarize(t *testing.T) {
	small, _ := hex.DecodeString(smallStream)
	sum, err := Summarize(bytes.NewReader(small))
	if err != nil {
		t.Fatal(err)
	}
	c := sum.Config
	if c == nil || c.Machine != "microvm" || !c.IgnoreShared() || c.TargetPageBits == nil || *c.TargetPageBits != 12 || string(c.UUID) != "0123456789abcdef" {
		t.Errorf("config %+v", c)
	}
	wantBlocks := []BlockInfo{{Name: "mem", Length: 2 * PageSize}, {Name: "rom", Length: PageSize, Addr: 0xfffff000}}
	if sum.RAMID != 2 || !slices.Equal(sum.Blocks, wantBlocks) || sum.Pages["mem"] != 2 || sum.Pages["rom"] != 2 || sum.DeviceTail != 1 {
		t.Errorf("summary %+v", sum)
	}
	var types []byte
	for _, s := range sum.Sections {
		types = append(types, s.Type)
	}
	if !bytes.Equal(types, []byte{SectionStart, SectionPart, SectionEnd, SectionEOF}) {
		t.Errorf("section types %v", types)
	}
}

// Every way a stream can be malformed fails with ErrFormat, never a
// panic; a truncated stream says so.
func TestReaderErrors(t *testing.T) {
	small, _ := hex.DecodeString(smallStream)
	for n := range len(small) - 1 { // the last byte is SectionEOF
		_, err := Summarize(bytes.NewReader(small[:n]))
		if !errors.Is(err, ErrFormat) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	// A start section, then the records of rec.
	withRecords := func(rec func(w *Writer)) []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Header()
		w.SectionHeader(SectionHeader{Type: SectionStart, ID: 2, Name: RAMSection, Version: RAMSectionVersion})
		rec(w)
		w.EOS()
		w.WriteByte(SectionEOF)
		w.Flush()
		return buf.Bytes()
	}
	raw := func(p ...byte) func(w *Writer) { return func(w *Writer) { w.Write(p) } }
	for _, c := range []struct {
		name   string
		stream []byte
		want   string
	}{
		{"magic", []byte("QEMU\x00\x00\x00\x03\x00"), "magic"},
		{"version", []byte("QEVM\x00\x00\x00\x04\x00"), "version 4"},
		{"machine name", []byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x01\x2c"), "machine name of 300 bytes"},
		{"subsection", []byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x00\x01m\x05\x03abc\x00\x00\x00\x01"), `unknown configuration subsection "abc"`},
		{"capabilities", []byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x00\x01m\x05\x1aconfiguration/capabilities\x00\x00\x00\x01\x00\x00\x01\x00"), "256 capabilities"},
		{"section type", []byte("QEVM\x00\x00\x00\x03\x09"), "section type 0x9 at byte 8"},
		{"not ram", []byte("QEVM\x00\x00\x00\x03\x01\x00\x00\x00\x02\x03rom\x00\x00\x00\x00\x00\x00\x00\x04"), `start section "rom"`},
		{"compressed", withRecords(raw(0, 0, 0, 0, 0, 0, 0, 0x40)), "flags 0x40"},
		{"continue", withRecords(raw(0, 0, 0, 0, 0, 0, 0, FlagContinue|FlagZero, 0)), "continues no block"},
		{"footer", withRecords(raw(0, 0, 0, 0, 0, 0, 0, FlagEOS, SectionFooter, 0, 0, 0, 3)), "footer of section 3 closes section 2"},
		{"block length", withRecords(raw(0, 0, 0, 0, 0, 0, 0x10, FlagMemSize, 1, 'm', 0, 0, 0, 0, 0, 0, 0x20, 0)), `RAM block "m" of 8192 bytes exceeds`},
	} {
		_, err := Summarize(bytes.NewReader(c.stream))
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an ErrFormat saying %q", c.name, err, c.want)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	for name, write := range map[string]func(w *Writer){
		"long name":   func(w *Writer) { w.Page(strings.Repeat("x", 256), 0, page(1)) },
		"short page":  func(w *Writer) { w.Record(Record{Flags: FlagPage, Block: "mem", Data: []byte{1}}) },
		"not a page":  func(w *Writer) { w.Record(Record{Flags: FlagEOS}) },
		"write error": func(w *Writer) { w.Header() },
	} {
		var dst io.Writer = io.Discard
		if name == "write error" {
			dst = failWriter{}
		}
		w := NewWriter(dst)
		write(w)
		err := w.Flush()
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if _, err2 := w.Write([]byte{1}); err2 != err || w.WriteByte(1) != err || w.Flush() != err {
			t.Errorf("%s: error %v not sticky (%v)", name, err, err2)
		}
		if name != "write error" && !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// ContinueFrom carries the block of the last record from one Writer to
// another, and Reset starts over.
func TestContinueFrom(t *testing.T) {
	var a, b bytes.Buffer
	wa, wb := NewWriter(&a), NewWriter(&b)
	wa.Page("rom", 0, page(1))
	wb.ContinueFrom(wa)
	wb.Record(Record{Flags: FlagZero, Block: "rom", Offset: PageSize, Fill: 2})
	wb.Flush()
	if want := "000000000000102202"; hex.EncodeToString(b.Bytes()) != want {
		t.Errorf("continued record %x, want %s", b.Bytes(), want)
	}
	b.Reset()
	wb.Reset(&b)
	wb.Record(Record{Flags: FlagZero, Block: "rom", Offset: PageSize, Fill: 2})
	wb.Flush()
	if want := "000000000000100203726f6d02"; hex.EncodeToString(b.Bytes()) != want || wb.Offset() != 13 {
		t.Errorf("after Reset: %x (offset %d), want %s", b.Bytes(), wb.Offset(), want)
	}
}
