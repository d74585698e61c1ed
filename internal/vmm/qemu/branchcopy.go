package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
)

// Copying a clone's memory for a branch (branch.go): the pages it wrote,
// found in its pagemap and read from /proc/PID/mem (or process_vm_readv),
// or all of its RAM, into the branch's memory file.

// openMemoryFile opens the file a clone's RAM maps (maps, from
// fileMappings): by its path while that still names it, else through
// /proc/PID/map_files, which reaches it after it was removed (root only).
func openMemoryFile(pid int, path string, maps []mapping) (*os.File, error) {
	same := func(f *os.File) bool {
		var st unix.Stat_t
		return unix.Fstat(int(f.Fd()), &st) == nil && st.Ino == maps[0].Inode &&
			unix.Major(st.Dev) == maps[0].Major && unix.Minor(st.Dev) == maps[0].Minor
	}
	if f, err := os.Open(path); err == nil {
		if same(f) {
			return f, nil
		}
		f.Close()
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, maps[0].Start, maps[0].End))
	if err != nil {
		return nil, fmt.Errorf("memory file %s: gone from its path, and its mapping: %w", path, err)
	}
	if !same(f) {
		f.Close()
		return nil, fmt.Errorf("memory file %s: its mapping in process %d is another file", path, pid)
	}
	return f, nil
}

// mapHugeBase maps a clone's memory file read-only when it is on
// hugetlbfs, and returns nil otherwise. There a write copies a whole huge
// page (2 MiB), most of it unchanged: a diff branch compares the copied
// pages with the file and keeps only the 4 KiB pages that differ, so a
// layer is as small as on tmpfs. The file is allocated whole when it is
// made (package sandbox), so this shared mapping reserves no new pages.
func mapHugeBase(path string, size uint64) ([]byte, error) {
	huge, err := fsutil.HugePageSize(filepath.Dir(path))
	if err != nil || huge == 0 {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
}

// copyPrivatePages copies the pages the clone wrote (anonymous pages in
// its private mappings of the memory file) into mw at their file offsets
// and records them in idx. With base (the memory file's contents), pages
// equal to it are left out. It says how it found them.
func copyPrivatePages(maps []mapping, pagemap *os.File, guest *guestMem, mw *memWriter, idx *memlayer.Builder, memSize uint64, base []byte) (string, error) {
	buf := make([]byte, 1<<20)
	how := "PAGEMAP_SCAN"
	if base != nil {
		how = "compared with the file"
	}
	for _, mp := range maps {
		end := mp.End
		if mp.Offset >= memSize {
			continue
		}
		if mp.Offset+mp.size() > memSize {
			end = mp.Start + (memSize - mp.Offset)
		}
		runs, scan, err := privatePages(pagemap, mp.Start, end, forcePagemapRead)
		if err != nil {
			return how, err
		}
		if !scan {
			how = "pagemap"
		}
		for _, r := range runs {
			off := mp.Offset + (r.Off - mp.Start)
			if base != nil {
				if err := copyChangedMem(guest, r.Off, r.Len, off, mw, idx, buf, base); err != nil {
					return how, err
				}
				continue
			}
			idx.Add(off/pageSize, r.Len/pageSize)
			if err := copyMem(guest, r.Off, r.Len, off, mw, buf); err != nil {
				return how, err
			}
		}
	}
	return how, nil
}

// forcePagemapRead makes diff branches read pagemap entries instead of
// using PAGEMAP_SCAN (tests of the fallback).
var forcePagemapRead bool

// copyAllPages copies all of the clone's RAM into mw.
func copyAllPages(maps []mapping, guest *guestMem, mw *memWriter, memSize uint64) error {
	buf := make([]byte, 2<<20)
	for _, mp := range maps {
		if mp.Offset >= memSize {
			continue
		}
		n := min(mp.size(), memSize-mp.Offset)
		if err := copyMem(guest, mp.Start, n, mp.Offset, mw, buf); err != nil {
			return err
		}
	}
	return nil
}

// guestMem reads a stopped QEMU's memory: with process_vm_readv, which
// copies straight from the pages (about 2.5x faster here than reading
// /proc/PID/mem, which bounces every page through a kernel buffer), and
// /proc/PID/mem where that syscall is not allowed (seccomp, ENOSYS).
type guestMem struct {
	pid     int
	proc    *os.File
	noVMRdv bool
}

// read fills buf with the memory at addr.
func (g *guestMem) read(buf []byte, addr uint64) error {
	for !g.noVMRdv && len(buf) > 0 {
		local := []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}}
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}
		n, err := unix.ProcessVMReadv(g.pid, local, remote, 0)
		if err != nil {
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
				g.noVMRdv = true
				break
			}
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		buf, addr = buf[n:], addr+uint64(n)
	}
	if len(buf) == 0 {
		return nil
	}
	_, err := g.proc.ReadAt(buf, int64(addr))
	return err
}

// copyMem copies n bytes of process memory at addr into mw at off.
func copyMem(guest *guestMem, addr, n, off uint64, mw *memWriter, buf []byte) error {
	for done := uint64(0); done < n; {
		k := min(uint64(len(buf)), n-done)
		if err := guest.read(buf[:k], addr+done); err != nil {
			return fmt.Errorf("read guest memory at %#x: %w", addr+done, err)
		}
		if err := mw.put(int64(off+done), buf[:k]); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// copyChangedMem is copyMem for pages that may equal the memory file's
// (base): only the runs of pages that differ from it are copied into mw
// and recorded in idx.
func copyChangedMem(guest *guestMem, addr, n, off uint64, mw *memWriter, idx *memlayer.Builder, buf, base []byte) error {
	for done := uint64(0); done < n; {
		k := min(uint64(len(buf)), n-done)
		if err := guest.read(buf[:k], addr+done); err != nil {
			return fmt.Errorf("read guest memory at %#x: %w", addr+done, err)
		}
		at := off + done
		if at+k > uint64(len(base)) {
			return fmt.Errorf("guest pages %#x+%#x outside the %d-byte memory file", at, k, len(base))
		}
		for i := uint64(0); i < k; {
			same := bytes.Equal(buf[i:i+pageSize], base[at+i:at+i+pageSize])
			j := i + pageSize
			for j < k && bytes.Equal(buf[j:j+pageSize], base[at+j:at+j+pageSize]) == same {
				j += pageSize
			}
			if !same {
				idx.Add((at+i)/pageSize, (j-i)/pageSize)
				if err := mw.put(int64(at+i), buf[i:j]); err != nil {
					return err
				}
			}
			i = j
		}
		done += k
	}
	return nil
}

// readBlocks reads the used part of the located RAM blocks.
func readBlocks(procMem *os.File, blocks []hmpRAMBlock, addr map[string]uint64) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, b := range blocks {
		a, ok := addr[b.Name]
		if !ok {
			continue
		}
		if b.Used > maxOtherRAMBytes {
			// QEMU's own word (info ramblock): not to be trusted with an allocation.
			return nil, fmt.Errorf("RAM block %s of %d bytes: more than %d", b.Name, b.Used, maxOtherRAMBytes)
		}
		data := make([]byte, (b.Used+pageSize-1)&^(pageSize-1))
		if _, err := procMem.ReadAt(data, int64(a)); err != nil {
			return nil, fmt.Errorf("read RAM block %s: %w", b.Name, err)
		}
		out[b.Name] = data
	}
	return out, nil
}

// readAllAt reads a file from its start: the device state QEMU saved,
// at most maxDeviceStateBytes.
func readAllAt(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxDeviceStateBytes {
		return nil, streamErr("device state of %d bytes, more than %d", st.Size(), maxDeviceStateBytes)
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, err
	}
	return data, nil
}
