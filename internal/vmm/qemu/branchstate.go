package qemu

import "os"

// The state file of a diff or full branch (branch.go): a migration stream
// without the pages of guest memory, with the small RAM blocks and the
// device state QEMU saved.

// branchConfig is the configuration section of a branch's state file:
// the machine type and the migration capabilities QEMU validates that
// the driver enables (x-ignore-shared, set on every machine by start).
func branchConfig() streamConfig {
	return streamConfig{Machine: branchMachineType, Caps: []string{capIgnoreShared}}
}

// branchBlockList is the block list of the "ram" start section: every RAM
// block with its used length, and its guest address (which QEMU checks
// only for blocks it skips as shared: none in a clone).
func branchBlockList(blocks []hmpRAMBlock) []ramBlockInfo {
	list := make([]ramBlockInfo, 0, len(blocks))
	for _, b := range blocks {
		e := ramBlockInfo{Name: b.Name, Length: b.Used}
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
func writeBranchPrefix(sw *streamWriter, ramID uint32, blocks []hmpRAMBlock, roms map[string][]byte) {
	sw.header()
	sw.config(branchConfig())
	sw.sectionHeader(sectionHeader{Type: secStart, ID: ramID, Name: ramSectionName, Version: ramSectionVersion})
	sw.blockList(branchBlockList(blocks), true)
	sw.eos()
	sw.footer(ramID)
	if len(roms) > 0 {
		sw.sectionHeader(sectionHeader{Type: secPart, ID: ramID})
		for _, b := range blocks {
			data, ok := roms[b.Name]
			if !ok || b.Name == memBlockName {
				continue
			}
			for off := 0; off < len(data); off += pageSize {
				sw.page(b.Name, uint64(off), data[off:off+pageSize])
			}
		}
		sw.eos()
		sw.footer(ramID)
	}
	sw.sectionHeader(sectionHeader{Type: secEnd, ID: ramID})
	sw.eos()
	sw.footer(ramID)
}

// vmDescription ends a state file like QEMU's own: loaders read and
// ignore it, but complain when it is missing.
var vmDescription = []byte(`{"page_size":4096,"devices":[]}`)

// writeBranchState writes a branch's state file from the device state
// QEMU saved (xen-save-devices-state: a stream of device sections only)
// and returns its size.
func writeBranchState(f *os.File, blocks []hmpRAMBlock, roms map[string][]byte, devState []byte) (int64, error) {
	if len(devState) < 9 || string(devState[:4]) != "QEVM" || devState[7] != streamVersion {
		return 0, streamErr("device state without a QEVM version 3 header")
	}
	body := devState[8:]
	if body[0] != secFull || body[len(body)-1] != secEOF {
		return 0, streamErr("device state does not start with a device section and end with EOF")
	}
	sw := newStreamWriter(f)
	writeBranchPrefix(sw, ramSectionID, blocks, roms)
	sw.write(body)
	sw.u8(secVMDescription)
	sw.be32(uint32(len(vmDescription)))
	sw.write(vmDescription)
	return sw.n, sw.flush()
}
