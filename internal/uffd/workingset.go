package uffd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// WorkingSet is the memory a run touched: the offsets (in the snapshot's
// memory, multiples of the page size) of the pages it faulted, in the
// order of their first fault.
//
// # File format
//
// All integers little-endian:
//
//	8 bytes  magic "FKDWSET1"
//	u64      page size in bytes
//	u64      number of pages N
//	N x      u64 offset
//	u32      CRC-32C of everything before it
type WorkingSet struct {
	PageSize uint64
	Offsets  []uint64
}

// wsMagic starts every working-set file.
const wsMagic = "FKDWSET1"

// maxWorkingSetFile bounds a working-set file: 8 bytes a page, so 1 GiB
// covers 512 GiB of 4 KiB pages.
const maxWorkingSetFile = 1 << 30

// errCorruptWorkingSet is returned for a file that does not decode.
var errCorruptWorkingSet = errors.New("uffd: corrupt working-set file")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MarshalBinary encodes the working set in the file format.
func (ws *WorkingSet) MarshalBinary() ([]byte, error) {
	if err := ws.validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 24+8*len(ws.Offsets)+4)
	b = append(b, wsMagic...)
	b = binary.LittleEndian.AppendUint64(b, ws.PageSize)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ws.Offsets)))
	for _, o := range ws.Offsets {
		b = binary.LittleEndian.AppendUint64(b, o)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// UnmarshalBinary decodes the file format.
func (ws *WorkingSet) UnmarshalBinary(b []byte) error {
	if len(b) < 28 || !bytes.Equal(b[:8], []byte(wsMagic)) {
		return fmt.Errorf("%w: no header", errCorruptWorkingSet)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return fmt.Errorf("%w: checksum mismatch", errCorruptWorkingSet)
	}
	n := binary.LittleEndian.Uint64(body[16:24])
	if uint64(len(body)-24) != 8*n {
		return fmt.Errorf("%w: %d pages in %d bytes", errCorruptWorkingSet, n, len(body))
	}
	out := WorkingSet{PageSize: binary.LittleEndian.Uint64(body[8:16]), Offsets: make([]uint64, n)}
	for i := range out.Offsets {
		out.Offsets[i] = binary.LittleEndian.Uint64(body[24+8*i:])
	}
	if err := out.validate(); err != nil {
		return err
	}
	*ws = out
	return nil
}

func (ws *WorkingSet) validate() error {
	if ws.PageSize == 0 || ws.PageSize&(ws.PageSize-1) != 0 {
		return fmt.Errorf("%w: page size %d", errCorruptWorkingSet, ws.PageSize)
	}
	for i, o := range ws.Offsets {
		if o%ws.PageSize != 0 {
			return fmt.Errorf("%w: offset %d (%#x) not a multiple of the page size %d", errCorruptWorkingSet, i, o, ws.PageSize)
		}
	}
	return nil
}

// WriteWorkingSet writes ws to path atomically (temporary file, fsync,
// rename).
func WriteWorkingSet(path string, ws *WorkingSet) error {
	b, err := ws.MarshalBinary()
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b, 0o600)
}

// ReadWorkingSet reads a working-set file.
func ReadWorkingSet(path string) (*WorkingSet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxWorkingSetFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxWorkingSetFile {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", path, errCorruptWorkingSet, maxWorkingSetFile)
	}
	var ws WorkingSet
	if err := ws.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &ws, nil
}
