package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// TestPrivatePages maps a file privately in this process, writes some
// pages and reads others, and checks that both scanners find exactly the
// written ones.
func TestPrivatePages(t *testing.T) {
	const pages = 64
	path := filepath.Join(t.TempDir(), "mem")
	if err := os.WriteFile(path, bytes.Repeat([]byte{1}, pages*pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	var sink byte
	for _, p := range []int{0, 5, 6, 40} {
		sink += mem[p*pageSize] // read: file pages
	}
	_ = sink
	for _, p := range []int{3, 4, 5, 20, 63} {
		mem[p*pageSize+7] = 9 // write: private copies
	}
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	want := []pageRun{{start + 3*pageSize, 3 * pageSize}, {start + 20*pageSize, pageSize}, {start + 63*pageSize, pageSize}}

	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	read, err := privatePagesRead(pm, start, start+pages*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(read, want) {
		t.Errorf("pagemap entries: %v, want %v", read, want)
	}
	scan, used, err := privatePages(pm, start, start+pages*pageSize, false)
	if err != nil {
		t.Fatal(err)
	}
	if !used {
		t.Logf("PAGEMAP_SCAN unavailable (kernel before 6.7?); fallback used")
	}
	if !slices.Equal(scan, want) {
		t.Errorf("PAGEMAP_SCAN: %v, want %v", scan, want)
	}
	// One region per call: the walk resumes where the kernel stopped.
	scanVecLen = 1
	scan, _, err = privatePages(pm, start, start+pages*pageSize, false)
	scanVecLen = 1024
	if err != nil || !slices.Equal(scan, want) {
		t.Errorf("PAGEMAP_SCAN one region at a time: %v %v, want %v", scan, err, want)
	}
	// The file is untouched.
	data, _ := os.ReadFile(path)
	if !bytes.Equal(data, bytes.Repeat([]byte{1}, pages*pageSize)) {
		t.Error("private writes reached the file")
	}
	// The mapping is found by inode: the one path names now, or the one
	// the file had when it was mapped, after it was renamed away and
	// removed (as forkd rmi does to a snapshot's directory).
	size := uint64(pages * pageSize)
	found := func(what, path string, id *fileID) {
		t.Helper()
		if maps, err := fileMappings(os.Getpid(), path, id, size); err != nil || len(maps) != 1 || maps[0].Start != start {
			t.Errorf("fileMappings, %s: %+v %v", what, maps, err)
		}
	}
	found("by path", path, nil)
	id := statFileID(path)
	moved := path + ".trash"
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	found("renamed, by identity", path, id)
	if err := os.Remove(moved); err != nil {
		t.Fatal(err)
	}
	found("removed, by identity", path, id)
	found("removed where it was, by its name in maps", moved, nil)
	if _, err := fileMappings(os.Getpid(), path, nil, size); err == nil || !strings.Contains(err.Error(), "not mapped") {
		t.Errorf("fileMappings of a file it cannot identify: %v", err)
	}
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	const size = 64 << 20
	src, err := os.OpenFile(filepath.Join(dir, "src"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	chunks := map[int64]byte{0: 1, 5 << 20: 2, 5<<20 + 4096: 3, size - 4096: 4}
	for off, b := range chunks {
		if _, err := src.WriteAt(bytes.Repeat([]byte{b}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	dst, err := os.OpenFile(filepath.Join(dir, "dst"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, err := fsutil.CopySparse(dst, src, size)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs")
	}
	alloc, _ := allocatedBytes(dst.Name())
	t.Logf("copied %d bytes, %d allocated", n, alloc)
	if alloc > 4<<20 {
		t.Errorf("copy not sparse: %d bytes allocated", alloc)
	}
}

// TestCopyChangedMem reads "guest" memory from this process (both ways
// guestMem reads) and keeps only the pages that differ from the base: a
// written run in the middle of a chunk, one at its end, and a page
// written with the value it already had, which is left out.
func TestCopyChangedMem(t *testing.T) {
	const pages = 16
	base := bytes.Repeat([]byte{7}, pages*pageSize)
	for _, viaProcMem := range []bool{false, true} {
		guestBuf := bytes.Clone(base)
		copy(guestBuf[2*pageSize:4*pageSize], bytes.Repeat([]byte{9}, 2*pageSize))
		guestBuf[15*pageSize+100] = 1
		guestBuf[8*pageSize] = 7 // same as before: not a change
		proc, err := os.Open("/proc/self/mem")
		if err != nil {
			t.Fatal(err)
		}
		g := &guestMem{pid: os.Getpid(), proc: proc, noVMRdv: viaProcMem}
		out, err := os.Create(filepath.Join(t.TempDir(), "layer"))
		if err != nil {
			t.Fatal(err)
		}
		mw := newMemWriter(out, pages*pageSize, false)
		idx := &memlayer.Builder{PageSize: pageSize, MemorySize: pages * pageSize}
		addr := uint64(uintptr(unsafe.Pointer(&guestBuf[0])))
		// A buffer of 3 pages: chunks end inside the written run.
		if err := copyChangedMem(g, addr, pages*pageSize, 0, mw, idx, make([]byte, 3*pageSize), base); err != nil {
			t.Fatal(err)
		}
		if err := mw.flush(); err != nil {
			t.Fatal(err)
		}
		proc.Close()
		want := []memlayer.Extent{{First: 2, Count: 2}, {First: 15, Count: 1}}
		if got := idx.Index().Extents; !slices.Equal(got, want) {
			t.Errorf("procmem=%v: extents %v, want %v", viaProcMem, got, want)
		}
		got := make([]byte, pages*pageSize)
		out.ReadAt(got, 0)
		for _, p := range []int{2, 3, 15} {
			if !bytes.Equal(got[p*pageSize:(p+1)*pageSize], guestBuf[p*pageSize:(p+1)*pageSize]) {
				t.Errorf("procmem=%v: page %d not copied", viaProcMem, p)
			}
		}
		out.Close()
	}
}

// TestMemIDSurvivesTheFile: the memory file's identity kept in the run
// directory outlives the file, for a daemon adopting the clone after its
// snapshot was removed.
func TestMemIDSurvivesTheFile(t *testing.T) {
	dir := t.TempDir()
	cfg := vmm.MachineConfig{RunDir: dir, MemoryFile: filepath.Join(dir, "memory")}
	if err := os.WriteFile(cfg.MemoryFile, []byte("ram"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := recordMemID(cfg)
	if id == nil || *id != *statFileID(cfg.MemoryFile) {
		t.Fatalf("recorded %+v", id)
	}
	os.Rename(cfg.MemoryFile, cfg.MemoryFile+".trash")
	os.Remove(cfg.MemoryFile + ".trash")
	if got := loadMemID(cfg); got == nil || *got != *id {
		t.Fatalf("loaded %+v once the file is gone, want %+v", got, id)
	}
	os.Remove(filepath.Join(dir, memIDFile))
	if got := loadMemID(cfg); got != nil {
		t.Fatalf("loaded %+v with nothing to load it from", got)
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
