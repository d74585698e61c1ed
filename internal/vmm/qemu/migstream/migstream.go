package migstream

import (
	"errors"
	"fmt"
	"slices"
)

// The header that starts every stream.
const (
	Magic   = 0x5145564d // "QEVM"
	Version = 3
)

// Section types: the byte before each section (and the footer after one).
const (
	SectionEOF           = 0x00 // end of the device state
	SectionStart         = 0x01 // first section of a save handler, named
	SectionPart          = 0x02 // a further section of it, by id
	SectionEnd           = 0x03 // its last section, by id
	SectionFull          = 0x04 // a device's whole state, named
	SectionSubsection    = 0x05 // a subsection (of the configuration)
	SectionVMDescription = 0x06 // JSON description after SectionEOF
	SectionConfiguration = 0x07 // the configuration section
	SectionCommand       = 0x08 // a command (postcopy; not supported)
	SectionFooter        = 0x7e // the footer that closes a section
)

// Flags of a RAM record ([Record.Flags]), in the low bits of its be64.
const (
	FlagZero     = 0x02 // a page of one repeated byte
	FlagMemSize  = 0x04 // the block list follows
	FlagPage     = 0x08 // a page of data
	FlagEOS      = 0x10 // end of the section's records
	FlagContinue = 0x20 // same block as the previous record, not named

	flagMask = 0xfff // flags live below the target page size
)

const (
	// RAMSection is the idstr of the "ram" save handler, whose sections
	// hold the page records.
	RAMSection = "ram"
	// RAMSectionVersion is the version of its start section.
	RAMSectionVersion = 4

	// CapIgnoreShared is the migration capability that makes the RAM
	// block list carry guest addresses.
	CapIgnoreShared = "x-ignore-shared"

	// PageSize is the target page size: the size of a page record.
	PageSize = 4096
)

// ErrFormat marks a stream the reader cannot handle: malformed,
// truncated, or using a feature it does not support.
var ErrFormat = errors.New("migration stream")

func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// Config is the configuration section.
type Config struct {
	Machine        string
	Caps           []string // migration capabilities to validate, in order
	TargetPageBits *uint32  // subsection present only on some targets
	UUID           []byte   // 16 bytes, subsection present with validate-uuid
}

// IgnoreShared reports whether the stream was written with
// x-ignore-shared, which puts guest addresses in the block list.
func (c *Config) IgnoreShared() bool { return slices.Contains(c.Caps, CapIgnoreShared) }

// BlockInfo is one entry of the block list of a MEM_SIZE record.
type BlockInfo struct {
	Name   string
	Length uint64
	Addr   uint64 // guest address, only with x-ignore-shared
}

// Record is one record of a "ram" section.
type Record struct {
	Flags  uint64
	Offset uint64 // in Block; MEM_SIZE: the total of the block list
	Block  string // ZERO and PAGE
	Fill   byte   // ZERO
	Data   []byte // PAGE: valid until the next read
}

// SectionHeader is the header of a start, part, end or full section.
type SectionHeader struct {
	Type     byte
	ID       uint32
	Name     string // start and full
	Instance uint32 // start and full
	Version  uint32 // start and full
}
