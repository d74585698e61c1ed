package fakevmm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// The state file: stateMagic, then one JSON object (deviceState). It is
// the fake's "device state": what a restore must match.
const (
	stateMagic = "FKDFAKE1\n"
	// maxStateSize bounds what Restore reads of a state file.
	maxStateSize = 64 << 10
)

type deviceState struct {
	VMM         string `json:"vmm"` // Version
	Machine     string `json:"machine"`
	MemoryBytes int64  `json:"memory_bytes"`
	VCPUs       int    `json:"vcpus"`
	PageSize    int    `json:"page_size"`
}

// writeState writes the state file of a machine of cfg (staged, fsynced,
// renamed); it returns its size.
func writeState(path string, cfg vmm.MachineConfig, size int64) (int64, error) {
	b, err := json.Marshal(deviceState{VMM: Version, Machine: cfg.ID, MemoryBytes: size, VCPUs: cfg.VCPUs, PageSize: pageSize})
	if err != nil {
		return 0, err
	}
	data := append([]byte(stateMagic), b...)
	if err := fsutil.WriteFileAtomic(path, data, 0o600); err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	return int64(len(data)), nil
}

// readState checks that path is a state file this driver wrote, for a
// machine of cfg with size bytes of memory.
func readState(path string, cfg vmm.MachineConfig, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("state file: %w; take the snapshot again: %w", err, notFoundOr(err, errdefs.ErrInvalidArgument))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateSize+1))
	if err != nil {
		return fmt.Errorf("state file: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	corrupt := func(why string) error {
		return fmt.Errorf("state file %s is not a fake VMM snapshot (%s); take the snapshot again: %w", path, why, errdefs.ErrInvalidArgument)
	}
	if len(data) > maxStateSize {
		return corrupt(fmt.Sprintf("over %d bytes", maxStateSize))
	}
	body, ok := bytes.CutPrefix(data, []byte(stateMagic))
	if !ok {
		return corrupt("no header")
	}
	var st deviceState
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return corrupt(err.Error())
	}
	switch {
	case st.VMM != Version:
		return fmt.Errorf("state file %s was written by %q; this is %q: %w", path, st.VMM, Version, errdefs.ErrFailedPrecondition)
	case st.PageSize != pageSize:
		return corrupt(fmt.Sprintf("page size %d", st.PageSize))
	case st.MemoryBytes != size || st.VCPUs != cfg.VCPUs:
		return fmt.Errorf("state file %s is of a machine with %d MiB and %d vCPUs, this one has %d MiB and %d; restore with the snapshotted machine's configuration: %w",
			path, st.MemoryBytes>>20, st.VCPUs, size>>20, cfg.VCPUs, errdefs.ErrInvalidArgument)
	}
	return nil
}

// notFoundOr is errdefs.ErrNotFound for a missing file, else class.
func notFoundOr(err, class error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.ErrNotFound
	}
	return class
}
