// Package migstream reads and writes QEMU 7.2's migration stream, as far as
// a branch needs it: the header, the configuration section, the sections of
// the "ram" save handler (page records) and, opaque, everything from the
// first device section on.
//
// Layout (migration/savevm.c and migration/ram.c of QEMU 7.2):
//
//	be32 magic "QEVM", be32 version 3
//	0x07 configuration: be32 len + machine type name, then subsections
//	     (0x05, u8 len + name, be32 version, fields), e.g. the list of
//	     migration capabilities the destination must also have
//	0x01 section start: be32 section id, u8 len + idstr, be32 instance,
//	     be32 version, content, footer
//	0x02 section part / 0x03 section end: be32 section id, content, footer
//	0x04 section full (device state): like 0x01, content not self-describing
//	0x00 end of file, then 0x06 + be32 len + JSON (description, unused
//	     when loading)
//	footer: 0x7e + be32 section id (machine types of the last years)
//
// The content of the "ram" sections is a sequence of records, each a be64
// of a page offset in its RAM block with flags in the low 12 bits:
//
//	MEM_SIZE 0x04  the offset is the total size; then per block: u8 len +
//	               idstr, be64 used length, and with x-ignore-shared be64
//	               guest address, until the lengths add up to the total
//	ZERO     0x02  [u8 len + idstr] u8 fill byte
//	PAGE     0x08  [u8 len + idstr] 4096 bytes
//	EOS      0x10  end of this section's records
//	CONTINUE 0x20  no idstr follows: same block as the previous record
//	               (carried across sections)
//
// Device sections cannot be parsed without QEMU's schemas, so a converter
// copies everything from the first 0x04 (or 0x00) on byte for byte (a
// [Reader] is also an [io.Reader] of the raw bytes, a [Writer] an
// [io.Writer]): every stream QEMU writes has all of its "ram" sections
// before that point.
//
// A [Reader] parses one element at a time and leaves the order of the
// sections to its caller; [Summarize] walks a whole stream. Every error
// about the stream's content wraps [ErrFormat].
package migstream
