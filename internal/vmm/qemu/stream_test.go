package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// page returns a page filled with b.
func testPage(b byte) []byte { return bytes.Repeat([]byte{b}, pageSize) }

// synthStream builds a stream like QEMU's: RAM block "mem" of memPages
// pages and a 2-page "rom", records spread over sections with CONTINUE
// crossing section boundaries, a rewritten page, then opaque device state.
func synthStream(t *testing.T, memPages int) (stream []byte, tail []byte) {
	t.Helper()
	var buf bytes.Buffer
	w := newStreamWriter(&buf)
	w.header()
	w.config(streamConfig{Machine: "microvm", Caps: []string{capIgnoreShared}})
	w.sectionHeader(sectionHeader{Type: secStart, ID: 2, Name: "ram", Version: 4})
	w.blockList([]ramBlockInfo{{Name: "mem", Length: uint64(memPages) * pageSize}, {Name: "rom", Length: 2 * pageSize, Addr: 0xffff0000}}, true)
	w.eos()
	w.footer(2)
	// Part 1: mem pages 0 (data), 1 (zero), 2 (data), then rom page 0.
	w.sectionHeader(sectionHeader{Type: secPart, ID: 2})
	w.page("mem", 0, testPage(1))
	w.page("mem", 1*pageSize, make([]byte, pageSize))
	w.page("mem", 2*pageSize, testPage(2))
	w.page("rom", 0, testPage(0xaa))
	w.eos()
	w.footer(2)
	// Part 2 continues "rom" without naming it, then mem pages.
	w.sectionHeader(sectionHeader{Type: secPart, ID: 2})
	w.page("rom", pageSize, make([]byte, pageSize))
	w.page("mem", 5*pageSize, testPage(5))
	w.page("mem", 6*pageSize, testPage(6))
	w.page("mem", 2*pageSize, make([]byte, pageSize)) // page 2 zeroed again
	w.pageHeader("mem", 7*pageSize, ramFlagZero)
	w.u8(7) // a page of 7s as a fill record
	w.eos()
	w.footer(2)
	// Part 3: only mem (dropped from the state), continuing "mem".
	w.sectionHeader(sectionHeader{Type: secPart, ID: 2})
	w.page("mem", uint64(memPages-1)*pageSize, testPage(9))
	w.eos()
	w.footer(2)
	// Part 4: rom again after a dropped section: must name its block.
	w.sectionHeader(sectionHeader{Type: secPart, ID: 2})
	w.page("rom", pageSize, testPage(0xbb))
	w.eos()
	w.footer(2)
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	tail = append([]byte{secFull}, []byte("\x00\x00\x00\x03\x05timer opaque device state \x7e\x00\x00\x00\x03\x00\x06\x00\x00\x00\x02{}")...)
	buf.Write(tail)
	return buf.Bytes(), tail
}

func TestSplitStream(t *testing.T) {
	const memPages = 64
	stream, tail := synthStream(t, memPages)
	dir := t.TempDir()
	mem, err := os.OpenFile(filepath.Join(dir, "mem"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var state bytes.Buffer
	st, err := splitStream(bytes.NewReader(stream), mem, &state, "mem", memPages*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if st.StreamBytes != int64(len(stream)) || st.StateBytes != int64(state.Len()) {
		t.Errorf("stats %+v, stream %d, state %d", st, len(stream), state.Len())
	}
	if st.MemPages != 5 || st.ZeroPages != 3 || st.OtherPages != 3 {
		t.Errorf("pages: %+v", st)
	}
	data, err := os.ReadFile(mem.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != memPages*pageSize {
		t.Fatalf("memory file %d bytes", len(data))
	}
	want := map[int]byte{0: 1, 5: 5, 6: 6, 7: 7, memPages - 1: 9}
	for p := range memPages {
		got := data[p*pageSize : (p+1)*pageSize]
		if !bytes.Equal(got, testPage(want[p])) {
			t.Errorf("page %d starts %v, want all %d", p, got[:4], want[p])
		}
	}
	// Zero pages are holes: only the 5 data pages are allocated.
	if alloc, _ := allocatedBytes(mem.Name()); alloc > 5*pageSize {
		t.Errorf("memory file allocates %d bytes", alloc)
	}
	// The state keeps everything but mem's pages, and the device tail
	// byte for byte.
	if !bytes.HasSuffix(state.Bytes(), tail) {
		t.Error("device state not copied verbatim")
	}
	sum, err := summarizeStream(bytes.NewReader(state.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Pages["mem"] != 0 || sum.Pages["rom"] != 3 || sum.RAMID != 2 || len(sum.Blocks) != 2 || sum.Blocks[1].Addr != 0xffff0000 {
		t.Errorf("state summary %+v", sum)
	}
	if sum.Config == nil || sum.Config.Machine != "microvm" || !slices.Equal(sum.Config.Caps, []string{capIgnoreShared}) {
		t.Errorf("config %+v", sum.Config)
	}
	// Sections: start, two parts with rom pages, the device tail.
	var types []byte
	for _, s := range sum.Sections {
		types = append(types, s.Type)
	}
	if !bytes.Equal(types, []byte{secStart, secPart, secPart, secPart, secFull}) {
		t.Errorf("section types %v", types)
	}
	roms := streamBlockPages(t, state.Bytes())
	if !bytes.Equal(roms["rom"][0], testPage(0xaa)) || !bytes.Equal(roms["rom"][1], testPage(0xbb)) {
		t.Error("rom pages not kept")
	}
}

// streamBlockPages returns the last content of every page of every block
// but mem in a stream.
func streamBlockPages(t *testing.T, stream []byte) map[string]map[uint64][]byte {
	t.Helper()
	sr := newStreamReader(bytes.NewReader(stream))
	if err := sr.header(); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[uint64][]byte{}
	var cfg streamConfig
	for {
		ty, err := sr.u8()
		if err != nil {
			t.Fatal(err)
		}
		switch ty {
		case secConfiguration:
			if cfg, err = sr.config(); err != nil {
				t.Fatal(err)
			}
			continue
		case secStart, secPart, secEnd:
		default:
			return out
		}
		h, err := sr.sectionHeader(ty)
		if err != nil {
			t.Fatal(err)
		}
		for {
			rec, err := sr.record()
			if err != nil {
				t.Fatal(err)
			}
			f := rec.Flags &^ ramFlagContinue
			if f == ramFlagEOS {
				break
			}
			if f == ramFlagMemSize {
				if _, err := sr.blockList(rec.Offset, cfg.ignoreShared()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if out[rec.Block] == nil {
				out[rec.Block] = map[uint64][]byte{}
			}
			p := bytes.Repeat([]byte{rec.Fill}, pageSize)
			if f == ramFlagPage {
				p = slices.Clone(rec.Data)
			}
			out[rec.Block][rec.Offset/pageSize] = p
		}
		if _, err := sr.footer(h.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSplitStreamErrors(t *testing.T) {
	stream, _ := synthStream(t, 16)
	dir := t.TempDir()
	try := func(name string, s []byte, block string) error {
		mem, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		memSize := int64(16 * pageSize)
		if name == "outside" {
			memSize = pageSize
		}
		_, err = splitStream(bytes.NewReader(s), mem, &bytes.Buffer{}, block, memSize)
		return err
	}
	// Truncated anywhere before the device state.
	for _, n := range []int{3, 20, 60, 200, 5000} {
		if err := try("t"+string(rune('a'+n%26)), stream[:n], "mem"); !errors.Is(err, errStream) {
			t.Errorf("truncated at %d: %v", n, err)
		}
	}
	if err := try("noblock", stream, "other"); !errors.Is(err, errStream) {
		t.Errorf("missing block: %v", err)
	}
	bad := slices.Clone(stream)
	bad[0] = 'X'
	if err := try("magic", bad, "mem"); !errors.Is(err, errStream) {
		t.Errorf("bad magic: %v", err)
	}
	// A page outside the block.
	var buf bytes.Buffer
	w := newStreamWriter(&buf)
	w.header()
	w.config(streamConfig{Machine: "microvm", Caps: []string{capIgnoreShared}})
	w.sectionHeader(sectionHeader{Type: secStart, ID: 2, Name: "ram", Version: 4})
	w.blockList([]ramBlockInfo{{Name: "mem", Length: pageSize}}, true)
	w.page("mem", 4*pageSize, testPage(1))
	w.eos()
	w.flush()
	if err := try("outside", buf.Bytes(), "mem"); !errors.Is(err, errStream) {
		t.Errorf("page outside the block: %v", err)
	}
}

func TestMemWriterBase(t *testing.T) {
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "m"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Base data everywhere.
	if _, err := f.Write(bytes.Repeat([]byte{0xee}, 8*pageSize)); err != nil {
		t.Fatal(err)
	}
	mw := newMemWriter(f, 8*pageSize, true)
	run := append(append(testPage(1), make([]byte, 2*pageSize)...), testPage(4)...)
	if err := mw.put(pageSize, run); err != nil { // pages 1..4
		t.Fatal(err)
	}
	if err := mw.flush(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(f.Name())
	want := []byte{0xee, 1, 0, 0, 4, 0xee, 0xee, 0xee}
	for p, b := range want {
		if !bytes.Equal(data[p*pageSize:(p+1)*pageSize], testPage(b)) {
			t.Errorf("page %d: %d, want %d", p, data[p*pageSize], b)
		}
	}
	if mw.pages != 2 || mw.bytes != 2*pageSize {
		t.Errorf("pages %d bytes %d", mw.pages, mw.bytes)
	}
}

func TestParseRAMBlocks(t *testing.T) {
	out := "              Block Name    PSize              Offset               Used              Total\r\n" +
		"                     mem    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000\r\n" +
		"    /rom@etc/acpi/tables    4 KiB  0x0000000010040000 0x0000000000001000 0x0000000000200000\r\n" +
		"                 pc.bios    4 KiB  0x0000000010000000 0x0000000000010000 0x0000000000010000\r\n"
	b, err := parseRAMBlocks(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []hmpRAMBlock{
		{"mem", 0, 256 << 20, 256 << 20},
		{"/rom@etc/acpi/tables", 0x10040000, 0x1000, 0x200000},
		{"pc.bios", 0x10000000, 0x10000, 0x10000},
	}
	if !slices.Equal(b, want) {
		t.Errorf("got %+v", b)
	}
	// QEMU 8.0 and later add HVA and RO columns (10.0.2 here).
	out10 := "              Block Name    PSize              Offset               Used              Total                HVA  RO\r\n" +
		"                     mem    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000 0x00007fd857fff000  rw\r\n" +
		"    /rom@etc/acpi/tables    4 KiB  0x0000000010040000 0x0000000000001000 0x0000000000200000 0x00007fd871e00000  ro\r\n" +
		"                 pc.bios    4 KiB  0x0000000010000000 0x0000000000010000 0x0000000000010000 0x00007fd872200000  rw\r\n"
	if b, err := parseRAMBlocks(out10); err != nil || !slices.Equal(b, want) {
		t.Errorf("QEMU 10 format: got %+v, %v", b, err)
	}
	if _, err := parseRAMBlocks("nothing"); err == nil {
		t.Error("no error for garbage")
	}
}

func TestParseMapsLine(t *testing.T) {
	m, ok := parseMapsLine("7f9e8bfff000-7f9e9bfff000 rw-p 00001000 fe:00 9977865                    /tmp/a b.mem")
	if !ok || m.Start != 0x7f9e8bfff000 || m.End != 0x7f9e9bfff000 || m.Offset != 0x1000 || m.Major != 0xfe || m.Minor != 0 ||
		m.Inode != 9977865 || m.Path != "/tmp/a b.mem" || m.Perms != "rw-p" {
		t.Errorf("%+v %v", m, ok)
	}
	m, ok = parseMapsLine("7f9ee2a00000-7f9ee2a01000 rw-p 00000000 00:00 0 ")
	if !ok || m.Path != "" || m.size() != 0x1000 {
		t.Errorf("%+v %v", m, ok)
	}
}
