package qemu

// Reading a running QEMU's guest memory from outside: where its RAM blocks
// are mapped (/proc/PID/maps and smaps), which pages of the memory file's
// private mapping the guest has written (PAGEMAP_SCAN, or /proc/PID/pagemap
// on kernels before 6.7), their contents (/proc/PID/mem), and a sparse copy
// of a memory file.
//
// A clone maps its memory file MAP_PRIVATE: a page it has only read is the
// file's page-cache page (a "file" page), a page it has written is a
// private anonymous copy. Those copies, present or swapped out, are exactly
// the pages in which the clone's memory differs from the file.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/vmm"
)

// mapping is one line of /proc/PID/maps.
type mapping struct {
	Start, End uint64
	Perms      string
	Offset     uint64
	Major      uint32
	Minor      uint32
	Inode      uint64
	Path       string
	VmFlags    []string // smaps only
}

func (m mapping) size() uint64 { return m.End - m.Start }

func (m mapping) hasFlag(f string) bool {
	for _, v := range m.VmFlags {
		if v == f {
			return true
		}
	}
	return false
}

// parseMapsLine parses "start-end perms offset major:minor inode [path]".
func parseMapsLine(line string) (mapping, bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return mapping{}, false
	}
	var m mapping
	s, e, ok := strings.Cut(fields[0], "-")
	if !ok {
		return m, false
	}
	var err1, err2, err3, err4 error
	m.Start, err1 = strconv.ParseUint(s, 16, 64)
	m.End, err2 = strconv.ParseUint(e, 16, 64)
	m.Perms = fields[1]
	m.Offset, err3 = strconv.ParseUint(fields[2], 16, 64)
	m.Inode, err4 = strconv.ParseUint(fields[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return m, false
	}
	maj, min, ok := strings.Cut(fields[3], ":")
	if !ok {
		return m, false
	}
	ma, err1 := strconv.ParseUint(maj, 16, 32)
	mi, err2 := strconv.ParseUint(min, 16, 32)
	if err1 != nil || err2 != nil {
		return m, false
	}
	m.Major, m.Minor = uint32(ma), uint32(mi)
	if len(fields) > 5 {
		// The path may contain spaces; it starts at the sixth field.
		idx := 0
		for i := 0; i < 5; i++ {
			idx += strings.Index(line[idx:], fields[i]) + len(fields[i])
		}
		m.Path = strings.TrimSpace(line[idx:])
	}
	return m, true
}

// readMaps reads /proc/PID/maps, or /proc/PID/smaps with withFlags (for
// the VmFlags; slower: the kernel walks every mapping's page tables).
func readMaps(pid int, withFlags bool) ([]mapping, error) {
	name := "maps"
	if withFlags {
		name = "smaps"
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/%s", pid, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if v, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			if len(out) > 0 {
				out[len(out)-1].VmFlags = strings.Fields(v)
			}
			continue
		}
		if m, ok := parseMapsLine(line); ok {
			out = append(out, m)
		}
	}
	return out, s.Err()
}

// fileID names a file by device and inode, as /proc/PID/maps does.
type fileID struct {
	Major, Minor uint32
	Ino          uint64
}

// statFileID is path's fileID; nil if it cannot be stat'ed.
func statFileID(path string) *fileID {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return nil
	}
	return &fileID{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), Ino: st.Ino}
}

// memIDFile, in a machine's run directory, holds its memID ("MAJOR:MINOR:INODE")
// for a daemon that adopts the machine later, when the memory file may be gone.
const memIDFile = "memory-file.id"

// recordMemID takes the identity of the memory file a clone's QEMU was
// started on and keeps it in the run directory; nil if it cannot be
// stat'ed (branches then look the file up by path).
func recordMemID(cfg vmm.MachineConfig) *fileID {
	id := statFileID(cfg.MemoryFile)
	if id != nil {
		os.WriteFile(filepath.Join(cfg.RunDir, memIDFile), []byte(fmt.Sprintf("%d:%d:%d\n", id.Major, id.Minor, id.Ino)), 0o600)
	}
	return id
}

// loadMemID reads what recordMemID kept for an adopted machine; a machine
// started by a forkd that kept none gets the file path names now.
func loadMemID(cfg vmm.MachineConfig) *fileID {
	var id fileID
	b, err := os.ReadFile(filepath.Join(cfg.RunDir, memIDFile))
	if err == nil {
		if _, err := fmt.Sscanf(string(b), "%d:%d:%d\n", &id.Major, &id.Minor, &id.Ino); err == nil {
			return &id
		}
	}
	return statFileID(cfg.MemoryFile)
}

// fileMappings returns the mappings in pid of the memory file at path,
// sorted by file offset, and checks that they cover its first size bytes.
// The file is found by id, its identity when the machine started (nil:
// unknown); failing that, by what path names now; failing that, by the
// name the kernel gives the mappings of a file removed since, "PATH
// (deleted)".
func fileMappings(pid int, path string, id *fileID, size uint64) ([]mapping, error) {
	maps, err := readMaps(pid, false)
	if err != nil {
		return nil, err
	}
	var out []mapping
	for _, want := range []*fileID{id, statFileID(path)} {
		for _, m := range maps {
			if want != nil && m.Inode == want.Ino && m.Major == want.Major && m.Minor == want.Minor {
				out = append(out, m)
			}
		}
		if len(out) > 0 {
			break
		}
	}
	if len(out) == 0 {
		for _, m := range maps {
			if m.Path == path+" (deleted)" {
				out = append(out, m)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("memory file %s: not mapped in process %d", path, pid)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	var next uint64
	for _, m := range out {
		if m.Offset != next {
			return nil, fmt.Errorf("memory file %s: mapped from offset %#x after %#x (mappings %v)", path, m.Offset, next, out)
		}
		next += m.size()
	}
	if next < size {
		return nil, fmt.Errorf("memory file %s: %d of %d bytes mapped in process %d", path, next, size, pid)
	}
	return out, nil
}

// pageRun is a run of pages: a file offset (for the memory file) or an
// address, and a length in bytes.
type pageRun struct {
	Off uint64
	Len uint64
}

// PAGEMAP_SCAN (linux/fs.h, Linux 6.7).
const (
	pageIsFile    = 1 << 2
	pageIsPresent = 1 << 3
	pageIsSwapped = 1 << 4

	// _IOWR('f', 16, struct pm_scan_arg): 96 bytes.
	ioctlPagemapScan = 0xc0606610
)

// pmScanArg is struct pm_scan_arg.
type pmScanArg struct {
	Size              uint64
	Flags             uint64
	Start             uint64
	End               uint64
	WalkEnd           uint64
	Vec               uint64
	VecLen            uint64
	MaxPages          uint64
	CategoryInverted  uint64
	CategoryMask      uint64
	CategoryAnyofMask uint64
	ReturnMask        uint64
}

// pageRegion is struct page_region.
type pageRegion struct {
	Start, End, Categories uint64
}

// scanVecLen is how many regions one PAGEMAP_SCAN call returns at most.
var scanVecLen = 1024

// errNoPagemapScan says the kernel lacks PAGEMAP_SCAN.
var errNoPagemapScan = errors.New("PAGEMAP_SCAN not supported")

// privatePagesScan returns the address runs in [start, end) whose pages
// are private to the process (anonymous, present or swapped) with the
// PAGEMAP_SCAN ioctl on an open /proc/PID/pagemap.
func privatePagesScan(pagemap *os.File, start, end uint64) ([]pageRun, error) {
	// On the heap (a length the compiler cannot know), as the kernel
	// writes to it through an address the garbage collector does not see.
	vec := make([]pageRegion, scanVecLen)
	defer runtime.KeepAlive(vec)
	var runs []pageRun
	for start < end {
		arg := pmScanArg{
			Size:   uint64(unsafe.Sizeof(pmScanArg{})),
			Start:  start,
			End:    end,
			Vec:    uint64(uintptr(unsafe.Pointer(&vec[0]))),
			VecLen: uint64(len(vec)),
			// Not a file page, and present or swapped.
			CategoryInverted:  pageIsFile,
			CategoryMask:      pageIsFile,
			CategoryAnyofMask: pageIsPresent | pageIsSwapped,
			// Report nothing but the ranges, so that neighbours merge.
			ReturnMask: pageIsFile,
		}
		n, _, errno := unix.Syscall(unix.SYS_IOCTL, pagemap.Fd(), ioctlPagemapScan, uintptr(unsafe.Pointer(&arg)))
		if errno != 0 {
			if (errno == unix.ENOTTY || errno == unix.EINVAL) && len(runs) == 0 {
				return nil, errNoPagemapScan
			}
			return nil, fmt.Errorf("PAGEMAP_SCAN: %w", errno)
		}
		for _, r := range vec[:n] {
			if k := len(runs); k > 0 && runs[k-1].Off+runs[k-1].Len == r.Start {
				runs[k-1].Len += r.End - r.Start
				continue
			}
			runs = append(runs, pageRun{Off: r.Start, Len: r.End - r.Start})
		}
		if arg.WalkEnd <= start {
			return nil, fmt.Errorf("PAGEMAP_SCAN made no progress at %#x", start)
		}
		start = arg.WalkEnd
	}
	return runs, nil
}

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent  = 1 << 63
	pmSwapped  = 1 << 62
	pmFileOrSh = 1 << 61
)

// privatePagesRead is privatePagesScan by reading one 8-byte pagemap
// entry per page (kernels before 6.7).
func privatePagesRead(pagemap *os.File, start, end uint64) ([]pageRun, error) {
	const chunk = 64 << 10 // entries per read
	buf := make([]byte, chunk*8)
	var runs []pageRun
	for addr := start; addr < end; {
		n := min((end-addr)/pageSize, chunk)
		b := buf[:n*8]
		if _, err := pagemap.ReadAt(b, int64(addr/pageSize*8)); err != nil {
			return nil, fmt.Errorf("read pagemap: %w", err)
		}
		for i := uint64(0); i < n; i++ {
			e := uint64(b[i*8]) | uint64(b[i*8+1])<<8 | uint64(b[i*8+2])<<16 | uint64(b[i*8+3])<<24 |
				uint64(b[i*8+4])<<32 | uint64(b[i*8+5])<<40 | uint64(b[i*8+6])<<48 | uint64(b[i*8+7])<<56
			if e&(pmPresent|pmSwapped) == 0 || e&pmFileOrSh != 0 {
				continue
			}
			a := addr + i*pageSize
			if k := len(runs); k > 0 && runs[k-1].Off+runs[k-1].Len == a {
				runs[k-1].Len += pageSize
				continue
			}
			runs = append(runs, pageRun{Off: a, Len: pageSize})
		}
		addr += n * pageSize
	}
	return runs, nil
}

// privatePages returns the private page runs of [start, end), with
// PAGEMAP_SCAN where the kernel has it, and whether it was used.
func privatePages(pagemap *os.File, start, end uint64, forceRead bool) ([]pageRun, bool, error) {
	if !forceRead {
		runs, err := privatePagesScan(pagemap, start, end)
		if err == nil {
			return runs, true, nil
		}
		if !errors.Is(err, errNoPagemapScan) {
			return nil, true, err
		}
	}
	runs, err := privatePagesRead(pagemap, start, end)
	return runs, false, err
}

// allocatedBytes is how much of a file is allocated on disk.
func allocatedBytes(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}

// hmpRAMBlock is a line of HMP "info ramblock".
type hmpRAMBlock struct {
	Name   string
	Offset uint64 // in QEMU's ram_addr space: allocation order
	Used   uint64
	Total  uint64
}

// parseRAMBlocks parses HMP "info ramblock" (QEMU 8.0 added the HVA and
// RO columns):
//
//	Block Name    PSize              Offset               Used              Total [HVA RO]
//	       mem    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000
func parseRAMBlocks(out string) ([]hmpRAMBlock, error) {
	var blocks []hmpRAMBlock
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// Name, then the page size as "4 KiB" (two fields), then Offset,
		// Used and Total. Names have no spaces (QEMU ids and paths).
		first := slices.IndexFunc(f, func(s string) bool { return strings.HasPrefix(s, "0x") })
		if first < 3 || len(f) < first+3 {
			continue
		}
		var vals [3]uint64
		for i := range vals {
			v, err := strconv.ParseUint(strings.TrimPrefix(f[first+i], "0x"), 16, 64)
			if err != nil {
				return nil, fmt.Errorf("info ramblock line %q: %w", line, err)
			}
			vals[i] = v
		}
		blocks = append(blocks, hmpRAMBlock{Name: strings.Join(f[:first-2], " "), Offset: vals[0], Used: vals[1], Total: vals[2]})
	}
	if len(blocks) == 0 {
		return nil, fmt.Errorf("info ramblock: no blocks in %q", out)
	}
	return blocks, nil
}

// romSignature checks the start of the RAM blocks whose contents are
// known, to tell blocks of the same size apart.
func romSignature(name string, data []byte) (known, ok bool) {
	switch name {
	case "/rom@etc/acpi/rsdp":
		return true, bytes.HasPrefix(data, []byte("RSD PTR "))
	case "/rom@etc/table-loader":
		// The first loader command (ALLOCATE) names a file "etc/...".
		return true, len(data) >= 8 && bytes.Equal(data[4:8], []byte("etc/"))
	}
	return false, false
}

// locateBlocks finds the host addresses of the anonymous RAM blocks (all
// but skip) in process pid. QEMU allocates every RAM block as a mapping
// of its own, marked MADV_DONTFORK ("dc" in smaps), of the block's
// maximum length rounded up to pages; blocks of the same length are told
// apart by their known contents or else by allocation order (QEMU's
// ram_addr offsets grow, the kernel places later mappings lower).
func locateBlocks(pid int, blocks []hmpRAMBlock, skip string, mem *os.File) (map[string]uint64, error) {
	maps, err := readMaps(pid, true)
	if err != nil {
		return nil, err
	}
	bySize := map[uint64][]mapping{}
	for _, m := range maps {
		if m.Inode == 0 && m.Path == "" && m.Perms == "rw-p" && m.hasFlag("dc") {
			bySize[m.size()] = append(bySize[m.size()], m)
		}
	}
	want := map[uint64][]hmpRAMBlock{}
	for _, b := range blocks {
		if b.Name == skip {
			continue
		}
		sz := (b.Total + pageSize - 1) &^ (pageSize - 1)
		want[sz] = append(want[sz], b)
	}
	out := map[string]uint64{}
	for sz, bs := range want {
		cands := bySize[sz]
		if len(cands) != len(bs) {
			return nil, fmt.Errorf("%d RAM blocks of %d bytes (%v) but %d anonymous RAM mappings of that size", len(bs), sz, bs, len(cands))
		}
		sort.Slice(bs, func(i, j int) bool { return bs[i].Offset < bs[j].Offset })
		sort.Slice(cands, func(i, j int) bool { return cands[i].Start > cands[j].Start })
		used := make([]bool, len(cands))
		var rest []hmpRAMBlock
		// Blocks with a known signature first, by content.
		for _, b := range bs {
			found := false
			for i, c := range cands {
				if used[i] {
					continue
				}
				head := make([]byte, 16)
				if _, err := mem.ReadAt(head, int64(c.Start)); err != nil {
					return nil, fmt.Errorf("read RAM block candidate at %#x: %w", c.Start, err)
				}
				known, ok := romSignature(b.Name, head)
				if !known {
					break
				}
				if ok {
					out[b.Name], used[i], found = c.Start, true, true
					break
				}
			}
			if !found {
				if known, _ := romSignature(b.Name, nil); known {
					return nil, fmt.Errorf("no mapping holds RAM block %q", b.Name)
				}
				rest = append(rest, b)
			}
		}
		// The others by allocation order.
		i := 0
		for _, b := range rest {
			for used[i] {
				i++
			}
			out[b.Name], used[i] = cands[i].Start, true
		}
	}
	return out, nil
}
