package uffd

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Bounds on what a VMM may send. Firecracker sends one region per guest
// memory slot: a handful.
const (
	// MaxRegions bounds the regions of one handshake.
	MaxRegions = 64
	// maxHandshake bounds the JSON of one handshake, in bytes.
	maxHandshake = 64 << 10
	// hugePageSize is the one page size besides the host's that regions
	// may have (Firecracker's huge_pages "2M").
	hugePageSize = 2 << 20
)

// Mapping is one region of guest memory as Firecracker describes it
// (GuestRegionUffdMapping): size bytes at host address BaseHostVirtAddr of
// the VMM hold the snapshot's memory from Offset on, in pages of PageSize
// bytes.
type Mapping struct {
	BaseHostVirtAddr uint64 `json:"base_host_virt_addr"`
	Size             uint64 `json:"size"`
	Offset           uint64 `json:"offset"`
	PageSize         uint64 `json:"page_size"`
	// PageSizeKiB is Firecracker's deprecated name of PageSize; despite
	// its name it is in bytes. Read when PageSize is absent.
	PageSizeKiB uint64 `json:"page_size_kib,omitempty"`
}

// end is the first host address after the region.
func (m Mapping) end() uint64 { return m.BaseHostVirtAddr + m.Size }

// ParseMappings decodes and checks the regions a VMM sent, for a snapshot
// memory of memSize bytes: at most MaxRegions; each with a page size of
// the host's or 2 MiB, an address, size and offset that are multiples of
// it, and offset+size within memSize; no two overlapping in the VMM's
// address space or in the memory. Anything else is an error wrapping
// errdefs.ErrInvalidArgument that names the region and the field.
func ParseMappings(data []byte, memSize uint64) ([]Mapping, error) {
	if len(data) > maxHandshake {
		return nil, invalid("%d bytes of region JSON, more than %d", len(data), maxHandshake)
	}
	var ms []Mapping
	if err := json.Unmarshal(data, &ms); err != nil {
		return nil, invalid("region JSON does not decode as an array of {base_host_virt_addr, size, offset, page_size}: %v", err)
	}
	if len(ms) == 0 || len(ms) > MaxRegions {
		return nil, invalid("%d regions; between 1 and %d expected", len(ms), MaxRegions)
	}
	for i := range ms {
		if err := ms[i].check(memSize); err != nil {
			return nil, fmt.Errorf("region %d: %w", i, err)
		}
	}
	if err := checkDisjoint(ms, func(m Mapping) (uint64, uint64) { return m.BaseHostVirtAddr, m.end() }, "host addresses"); err != nil {
		return nil, err
	}
	if err := checkDisjoint(ms, func(m Mapping) (uint64, uint64) { return m.Offset, m.Offset + m.Size }, "memory offsets"); err != nil {
		return nil, err
	}
	return ms, nil
}

// check validates one region and settles its page size.
func (m *Mapping) check(memSize uint64) error {
	switch {
	case m.PageSize == 0:
		m.PageSize = m.PageSizeKiB
	case m.PageSizeKiB != 0 && m.PageSizeKiB != m.PageSize:
		return invalid("page_size %d and page_size_kib %d disagree", m.PageSize, m.PageSizeKiB)
	}
	host := uint64(os.Getpagesize())
	if m.PageSize != host && m.PageSize != hugePageSize {
		return invalid("page_size %d; %d or %d expected", m.PageSize, host, hugePageSize)
	}
	ps := m.PageSize
	switch {
	case m.Size == 0 || m.Size%ps != 0:
		return invalid("size %d is not a positive multiple of the page size %d", m.Size, ps)
	case m.BaseHostVirtAddr == 0 || m.BaseHostVirtAddr%ps != 0:
		return invalid("base_host_virt_addr %#x is not a non-zero multiple of the page size %d", m.BaseHostVirtAddr, ps)
	case m.end() < m.BaseHostVirtAddr:
		return invalid("base_host_virt_addr %#x + size %d overflows", m.BaseHostVirtAddr, m.Size)
	case m.Offset%ps != 0:
		return invalid("offset %d is not a multiple of the page size %d", m.Offset, ps)
	case m.Offset+m.Size < m.Offset || m.Offset+m.Size > memSize:
		return invalid("offset %d + size %d is beyond the snapshot's %d bytes of memory", m.Offset, m.Size, memSize)
	}
	return nil
}

// checkDisjoint fails when two regions' ranges, as span gives them,
// overlap.
func checkDisjoint(ms []Mapping, span func(Mapping) (uint64, uint64), what string) error {
	idx := make([]int, len(ms))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		sa, _ := span(ms[idx[a]])
		sb, _ := span(ms[idx[b]])
		return sa < sb
	})
	for k := 1; k < len(idx); k++ {
		_, prevEnd := span(ms[idx[k-1]])
		if start, _ := span(ms[idx[k]]); start < prevEnd {
			return invalid("regions %d and %d overlap in %s", idx[k-1], idx[k], what)
		}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("uffd: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}
