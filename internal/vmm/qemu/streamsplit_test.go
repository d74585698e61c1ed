package qemu

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/vmm/qemu/migstream"
)

// testPage returns a page filled with b.
func testPage(b byte) []byte { return bytes.Repeat([]byte{b}, pageSize) }

// synthStream builds a stream like QEMU's: RAM block "mem" of memPages
// pages and a 2-page "rom", records spread over sections with CONTINUE
// crossing section boundaries, a rewritten page, then opaque device state.
func synthStream(t *testing.T, memPages int) (stream []byte, tail []byte) {
	t.Helper()
	var buf bytes.Buffer
	w := migstream.NewWriter(&buf)
	w.Header()
	w.Config(migstream.Config{Machine: "microvm", Caps: []string{migstream.CapIgnoreShared}})
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionStart, ID: 2, Name: "ram", Version: 4})
	w.BlockList([]migstream.BlockInfo{{Name: "mem", Length: uint64(memPages) * pageSize}, {Name: "rom", Length: 2 * pageSize, Addr: 0xffff0000}}, true)
	w.EOS()
	w.Footer(2)
	// Part 1: mem pages 0 (data), 1 (zero), 2 (data), then rom page 0.
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionPart, ID: 2})
	w.Page("mem", 0, testPage(1))
	w.Page("mem", 1*pageSize, make([]byte, pageSize))
	w.Page("mem", 2*pageSize, testPage(2))
	w.Page("rom", 0, testPage(0xaa))
	w.EOS()
	w.Footer(2)
	// Part 2 continues "rom" without naming it, then mem pages.
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionPart, ID: 2})
	w.Page("rom", pageSize, make([]byte, pageSize))
	w.Page("mem", 5*pageSize, testPage(5))
	w.Page("mem", 6*pageSize, testPage(6))
	w.Page("mem", 2*pageSize, make([]byte, pageSize))                                                  // page 2 zeroed again
	w.Record(migstream.Record{Flags: migstream.FlagZero, Block: "mem", Offset: 7 * pageSize, Fill: 7}) // a page of 7s
	w.EOS()
	w.Footer(2)
	// Part 3: only mem (dropped from the state), continuing "mem".
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionPart, ID: 2})
	w.Page("mem", uint64(memPages-1)*pageSize, testPage(9))
	w.EOS()
	w.Footer(2)
	// Part 4: rom again after a dropped section: must name its block.
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionPart, ID: 2})
	w.Page("rom", pageSize, testPage(0xbb))
	w.EOS()
	w.Footer(2)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	tail = append([]byte{migstream.SectionFull}, []byte("\x00\x00\x00\x03\x05timer opaque device state \x7e\x00\x00\x00\x03\x00\x06\x00\x00\x00\x02{}")...)
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
	sum, err := migstream.Summarize(bytes.NewReader(state.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Pages["mem"] != 0 || sum.Pages["rom"] != 3 || sum.RAMID != 2 || len(sum.Blocks) != 2 || sum.Blocks[1].Addr != 0xffff0000 {
		t.Errorf("state summary %+v", sum)
	}
	if sum.Config == nil || sum.Config.Machine != "microvm" || !slices.Equal(sum.Config.Caps, []string{migstream.CapIgnoreShared}) {
		t.Errorf("config %+v", sum.Config)
	}
	// Sections: start, two parts with rom pages, the device tail.
	var types []byte
	for _, s := range sum.Sections {
		types = append(types, s.Type)
	}
	if !bytes.Equal(types, []byte{migstream.SectionStart, migstream.SectionPart, migstream.SectionPart, migstream.SectionPart, migstream.SectionFull}) {
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
	sr := migstream.NewReader(bytes.NewReader(stream))
	if err := sr.Header(); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[uint64][]byte{}
	var cfg migstream.Config
	for {
		ty, err := sr.SectionType()
		if err != nil {
			t.Fatal(err)
		}
		switch ty {
		case migstream.SectionConfiguration:
			if cfg, err = sr.Config(); err != nil {
				t.Fatal(err)
			}
			continue
		case migstream.SectionStart, migstream.SectionPart, migstream.SectionEnd:
		default:
			return out
		}
		h, err := sr.SectionHeader(ty)
		if err != nil {
			t.Fatal(err)
		}
		for {
			rec, err := sr.Record()
			if err != nil {
				t.Fatal(err)
			}
			f := rec.Flags &^ migstream.FlagContinue
			if f == migstream.FlagEOS {
				break
			}
			if f == migstream.FlagMemSize {
				if _, err := sr.BlockList(rec.Offset, cfg.IgnoreShared()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if out[rec.Block] == nil {
				out[rec.Block] = map[uint64][]byte{}
			}
			p := bytes.Repeat([]byte{rec.Fill}, pageSize)
			if f == migstream.FlagPage {
				p = slices.Clone(rec.Data)
			}
			out[rec.Block][rec.Offset/pageSize] = p
		}
		if _, err := sr.Footer(h.ID); err != nil {
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
		if err := try("t"+string(rune('a'+n%26)), stream[:n], "mem"); !errors.Is(err, migstream.ErrFormat) {
			t.Errorf("truncated at %d: %v", n, err)
		}
	}
	if err := try("noblock", stream, "other"); !errors.Is(err, migstream.ErrFormat) {
		t.Errorf("missing block: %v", err)
	}
	bad := slices.Clone(stream)
	bad[0] = 'X'
	if err := try("magic", bad, "mem"); !errors.Is(err, migstream.ErrFormat) {
		t.Errorf("bad magic: %v", err)
	}
	// A page outside the block.
	var buf bytes.Buffer
	w := migstream.NewWriter(&buf)
	w.Header()
	w.Config(migstream.Config{Machine: "microvm", Caps: []string{migstream.CapIgnoreShared}})
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionStart, ID: 2, Name: "ram", Version: 4})
	w.BlockList([]migstream.BlockInfo{{Name: "mem", Length: pageSize}}, true)
	w.Page("mem", 4*pageSize, testPage(1))
	w.EOS()
	w.Flush()
	if err := try("outside", buf.Bytes(), "mem"); !errors.Is(err, migstream.ErrFormat) {
		t.Errorf("page outside the block: %v", err)
	}
}

// craftedMemPages is the memory of the machine the crafted streams claim
// to come from.
const craftedMemPages = 16

// craftedStream is a stream up to its first section's records: header,
// configuration, a ram start section. records writes the rest of that
// section (the block list included); the section then ends, and a device
// section follows.
func craftedStream(t *testing.T, records func(w *migstream.Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := migstream.NewWriter(&buf)
	w.Header()
	w.Config(migstream.Config{Machine: "microvm", Caps: []string{migstream.CapIgnoreShared}})
	w.SectionHeader(migstream.SectionHeader{Type: migstream.SectionStart, ID: 2, Name: migstream.RAMSection, Version: migstream.RAMSectionVersion})
	records(w)
	w.EOS()
	w.Footer(2)
	w.WriteByte(migstream.SectionFull)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// goodBlocks is the block list of a well-formed stream: memory of the
// machine's size and a 2-page ROM.
func goodBlocks(w *migstream.Writer) {
	w.BlockList([]migstream.BlockInfo{{Name: memBlockName, Length: craftedMemPages * pageSize}, {Name: "rom", Length: 2 * pageSize}}, true)
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// counter counts what is written to it and drops it.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// Streams with lengths and offsets that do not fit the machine fail with
// an error naming the field, before anything is sized by them: the
// memory file does not grow past the machine's memory, the state stays
// bounded, and little is allocated.
func TestSplitStreamRejectsCraftedStreams(t *testing.T) {
	page := testPage(0x5a)
	for _, c := range []struct {
		name   string
		stream io.Reader
		want   string
	}{
		{"huge RAM total", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			w.BlockList([]migstream.BlockInfo{{Name: memBlockName, Length: 1 << 40}}, true)
		})), "MEM_SIZE"},
		{"memory block larger than the machine", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			w.BlockList([]migstream.BlockInfo{{Name: memBlockName, Length: 2 * craftedMemPages * pageSize}}, true)
		})), "the machine's memory is"},
		{"block listed twice", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			w.BlockList([]migstream.BlockInfo{{Name: "rom", Length: pageSize}, {Name: memBlockName, Length: craftedMemPages * pageSize}, {Name: "rom", Length: pageSize}}, true)
		})), "listed twice"},
		{"page before the block list", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			w.Page(memBlockName, 0, page)
		})), "before the block list"},
		{"memory page past the end", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			goodBlocks(w)
			w.Page(memBlockName, 1<<40, page)
		})), "past the end of RAM block"},
		{"memory page offset that overflows", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			goodBlocks(w)
			w.Page(memBlockName, 1<<63-pageSize, page)
		})), "past the end of RAM block"},
		{"page of a block not listed", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			goodBlocks(w)
			w.Page("vram", 0, page)
		})), "not in the block list"},
		{"ROM page past the end", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			goodBlocks(w)
			w.Page("rom", 2*pageSize, page)
		})), "past the end of RAM block"},
		{"ROM page sent over and over", bytes.NewReader(craftedStream(t, func(w *migstream.Writer) {
			goodBlocks(w)
			for range 1000 {
				w.Page("rom", 0, page)
			}
		})), "over and over"},
		{"endless device state", io.MultiReader(bytes.NewReader(craftedStream(t, goodBlocks)), zeros{}), "device state"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, err := os.OpenFile(filepath.Join(t.TempDir(), "mem"), os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			var state counter
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = splitStream(c.stream, mem, &state, memBlockName, craftedMemPages*pageSize)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, migstream.ErrFormat) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("splitStream = %v, want a stream error saying %q", err, c.want)
			}
			t.Log(err)
			if st, err := mem.Stat(); err != nil || st.Size() > craftedMemPages*pageSize {
				t.Errorf("memory file grew to %d bytes (%v)", st.Size(), err)
			}
			if state.n > maxDeviceStateBytes+sectionSlackBytes {
				t.Errorf("%d bytes of state written", state.n)
			}
			// The reader's and writers' buffers are a few MiB.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
				t.Errorf("allocated %d MiB", alloc>>20)
			}
		})
	}
}

// A stream that fits the machine still splits.
func TestSplitStreamAcceptsFittingStream(t *testing.T) {
	mem, err := os.OpenFile(filepath.Join(t.TempDir(), "mem"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	stream := craftedStream(t, func(w *migstream.Writer) {
		goodBlocks(w)
		w.Page(memBlockName, (craftedMemPages-1)*pageSize, testPage(1))
		w.Page("rom", pageSize, testPage(2))
	})
	var state bytes.Buffer
	st, err := splitStream(bytes.NewReader(stream), mem, &state, memBlockName, craftedMemPages*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if st.MemPages != 1 || st.OtherPages != 1 {
		t.Errorf("stats %+v", st)
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
