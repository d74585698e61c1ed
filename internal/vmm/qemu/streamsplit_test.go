package qemu

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// craftedMemPages is the memory of the machine the crafted streams claim
// to come from.
const craftedMemPages = 16

// craftedStream is a stream up to its first section's records: header,
// configuration, a ram start section. records writes the rest of that
// section (the block list included); the section then ends, and a device
// section follows.
func craftedStream(t *testing.T, records func(w *streamWriter)) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := newStreamWriter(&buf)
	w.header()
	w.config(streamConfig{Machine: "microvm", Caps: []string{capIgnoreShared}})
	w.sectionHeader(sectionHeader{Type: secStart, ID: 2, Name: ramSectionName, Version: ramSectionVersion})
	records(w)
	w.eos()
	w.footer(2)
	w.u8(secFull)
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// goodBlocks is the block list of a well-formed stream: memory of the
// machine's size and a 2-page ROM.
func goodBlocks(w *streamWriter) {
	w.blockList([]ramBlockInfo{{Name: memBlockName, Length: craftedMemPages * pageSize}, {Name: "rom", Length: 2 * pageSize}}, true)
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
		{"huge RAM total", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			w.blockList([]ramBlockInfo{{Name: memBlockName, Length: 1 << 40}}, true)
		})), "MEM_SIZE"},
		{"memory block larger than the machine", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			w.blockList([]ramBlockInfo{{Name: memBlockName, Length: 2 * craftedMemPages * pageSize}}, true)
		})), "the machine's memory is"},
		{"block listed twice", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			w.blockList([]ramBlockInfo{{Name: "rom", Length: pageSize}, {Name: memBlockName, Length: craftedMemPages * pageSize}, {Name: "rom", Length: pageSize}}, true)
		})), "listed twice"},
		{"page before the block list", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			w.page(memBlockName, 0, page)
		})), "before the block list"},
		{"memory page past the end", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			goodBlocks(w)
			w.page(memBlockName, 1<<40, page)
		})), "past the end of RAM block"},
		{"memory page offset that overflows", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			goodBlocks(w)
			w.page(memBlockName, 1<<63-pageSize, page)
		})), "past the end of RAM block"},
		{"page of a block not listed", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			goodBlocks(w)
			w.page("vram", 0, page)
		})), "not in the block list"},
		{"ROM page past the end", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			goodBlocks(w)
			w.page("rom", 2*pageSize, page)
		})), "past the end of RAM block"},
		{"ROM page sent over and over", bytes.NewReader(craftedStream(t, func(w *streamWriter) {
			goodBlocks(w)
			for range 1000 {
				w.page("rom", 0, page)
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
			if !errors.Is(err, errStream) || !strings.Contains(err.Error(), c.want) {
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
	stream := craftedStream(t, func(w *streamWriter) {
		goodBlocks(w)
		w.page(memBlockName, (craftedMemPages-1)*pageSize, testPage(1))
		w.page("rom", pageSize, testPage(2))
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
