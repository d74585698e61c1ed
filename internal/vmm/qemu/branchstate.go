package qemu

import (
	"os"

	"github.com/forkd-dev/forkd/internal/vmm/qemu/migstream"
)

// The state file of a diff or full branch (branch.go): a migration stream
// without the pages of guest memory, with the small RAM blocks and the
// device state QEMU saved.

// branchConfig is the configuration section of a branch's state file:
// the machine type and the migration capabilities QEMU validates that
// the driver enables (x-ignore-shared, set on every machine by start).
func branchConfig() migstream.Config {
	return migstream.Config{Machine: branchMachineType, Caps: []string{migstream.CapIgnoreShared}}
}

// branchBlockList is the block list of the "ram" start section: every RAM
// block with its used length, and its guest address (which QEMU checks
// only for blocks it skips as shared: none in a clone).
func branchBlockList(blocks []hmpRAMBlock) []migstream.BlockInfo {
	list := make([]migstream.BlockInfo, 0, len(blocks))
	for _, b := range blocks {
		e := migstream.BlockInfo{Name: b.Name, Length: b.Used}
		if b.Name == biosBlock {
			e.Addr = 1<<32 - b.Total
		}
		list = append(list, e)
	}
	return list
}

// writeBranchPrefix writes what precedes the device state in a branch's
// state file: header, configuration, and the ram sections with the block
// list and the pages of the small blocks in roms.
func writeBranchPrefix(sw *migstream.Writer, ramID uint32, blocks []hmpRAMBlock, roms map[string][]byte) {
	sw.Header()
	sw.Config(branchConfig())
	sw.SectionHeader(migstream.SectionHeader{Type: migstream.SectionStart, ID: ramID, Name: migstream.RAMSection, Version: migstream.RAMSectionVersion})
	sw.BlockList(branchBlockList(blocks), true)
	sw.EOS()
	sw.Footer(ramID)
	if len(roms) > 0 {
		sw.SectionHeader(migstream.SectionHeader{Type: migstream.SectionPart, ID: ramID})
		for _, b := range blocks {
			data, ok := roms[b.Name]
			if !ok || b.Name == memBlockName {
				continue
			}
			for off := 0; off < len(data); off += pageSize {
				sw.Page(b.Name, uint64(off), data[off:off+pageSize])
			}
		}
		sw.EOS()
		sw.Footer(ramID)
	}
	sw.SectionHeader(migstream.SectionHeader{Type: migstream.SectionEnd, ID: ramID})
	sw.EOS()
	sw.Footer(ramID)
}

// vmDescription ends a state file like QEMU's own: loaders read and
// ignore it, but complain when it is missing.
var vmDescription = []byte(`{"page_size":4096,"devices":[]}`)

// writeBranchState writes a branch's state file from the device state
// QEMU saved (xen-save-devices-state: a stream of device sections only)
// and returns its size.
func writeBranchState(f *os.File, blocks []hmpRAMBlock, roms map[string][]byte, devState []byte) (int64, error) {
	if len(devState) < 9 || string(devState[:4]) != "QEVM" || devState[7] != migstream.Version {
		return 0, streamErr("device state without a QEVM version 3 header")
	}
	body := devState[8:]
	if body[0] != migstream.SectionFull || body[len(body)-1] != migstream.SectionEOF {
		return 0, streamErr("device state does not start with a device section and end with EOF")
	}
	sw := migstream.NewWriter(f)
	writeBranchPrefix(sw, ramSectionID, blocks, roms)
	sw.Write(body)
	sw.VMDescription(vmDescription)
	return sw.Offset(), sw.Flush()
}
