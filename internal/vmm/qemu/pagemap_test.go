package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/fsutil"
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
	// The mapping is found by inode.
	maps, err := fileMappings(os.Getpid(), path, pages*pageSize)
	if err != nil || len(maps) != 1 || maps[0].Start != start {
		t.Errorf("fileMappings: %+v %v", maps, err)
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
