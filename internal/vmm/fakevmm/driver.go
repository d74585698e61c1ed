package fakevmm

import (
	"context"
	"fmt"
	"os"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Name is the driver's name (Driver.Name); it is not registered.
const Name = "fake"

// Version is the fake VMM's version, recorded in its state files.
const Version = "fakevmm 1"

// The capabilities the driver and its machines offer beyond vmm.Driver and
// vmm.Machine (internal/vmm/capabilities.go).
var (
	_ vmm.Driver          = (*Driver)(nil)
	_ vmm.Adopter         = (*Driver)(nil)
	_ vmm.FeatureReporter = (*Driver)(nil)
	_ vmm.RestoreChecker  = (*Driver)(nil)

	_ vmm.Machine      = (*Machine)(nil)
	_ vmm.Identifiable = (*Machine)(nil)
	_ vmm.Pauser       = (*Machine)(nil)
)

// Driver makes fake machines; it holds nothing of its own (New or the
// zero value). Drivers share the process-wide registry of machines, so a Driver made
// after another (a restarted daemon) can adopt that one's machines.
type Driver struct{}

// New returns a fake driver.
func New() *Driver { return &Driver{} }

// Name is "fake".
func (d *Driver) Name() string { return Name }

// Version is the fake VMM's Version.
func (d *Driver) Version(context.Context) (string, error) { return Version, nil }

// Features: diff snapshots (the guest's writes are tracked, so
// TrackDirtyPages is not needed); no live snapshots.
func (d *Driver) Features() vmm.Features { return vmm.Features{DiffSnapshots: true} }

// CanRestore accepts state files of this Version only.
func (d *Driver) CanRestore(version string) error {
	if version != Version {
		return fmt.Errorf("fake driver restores snapshots of %q, not %q: %w", Version, version, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Boot starts a fresh machine. The image's kernel must be a non-empty
// regular file (it is not read). With cfg.MemoryFile, guest memory is a
// shared mapping of that file, created anew (a new file, so machines that
// mapped an earlier one at that path keep theirs); without it, anonymous.
func (d *Driver) Boot(ctx context.Context, spec vmm.BootSpec) (vmm.Machine, error) {
	cfg := spec.MachineConfig
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if err := checkImage(cfg); err != nil {
		return nil, err
	}
	size := memBytes(cfg)
	var f *os.File
	if cfg.MemoryFile != "" {
		var err error
		if f, err = createMemoryFile(cfg.MemoryFile, size); err != nil {
			return nil, fmt.Errorf("fakevmm %s: memory file: %w", cfg.ID, err)
		}
	}
	v, err := newVM(cfg, statePrepared)
	if err != nil {
		if f != nil {
			f.Close()
		}
		return nil, err
	}
	if err := v.setMemory(f, size, true); err != nil {
		if f != nil {
			f.Close()
		}
		err = fmt.Errorf("fakevmm %s: boot: %w", cfg.ID, err)
		v.exit(err)
		return nil, err
	}
	v.log("fakevmm: booted %s with %d MiB, %d vCPUs", cfg.Image.Kernel, cfg.MemoryMiB, cfg.VCPUs)
	v.run()
	return &Machine{v: v}, nil
}

// Prepare starts a machine that waits for Restore to load spec.StateFile
// and map cfg.MemoryFile private. Only the file memory backend is offered.
func (d *Driver) Prepare(ctx context.Context, spec vmm.PrepareSpec) (vmm.Machine, error) {
	cfg := spec.MachineConfig
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if spec.MemoryBackend != vmm.MemoryBackendFile {
		return nil, fmt.Errorf("fakevmm %s: memory backend %q: only the memory file is offered: %w", cfg.ID, spec.MemoryBackend, errdefs.ErrNotImplemented)
	}
	if cfg.MemoryFile == "" || spec.StateFile == "" {
		return nil, fmt.Errorf("fakevmm %s: prepare needs the snapshot's memory file and state file (got %q, %q): %w",
			cfg.ID, cfg.MemoryFile, spec.StateFile, errdefs.ErrInvalidArgument)
	}
	v, err := newVM(cfg, statePrepared)
	if err != nil {
		return nil, err
	}
	v.stateFile = spec.StateFile
	return &Machine{v: v}, nil
}

// Adopt takes over a machine that another Driver (an earlier daemon)
// started, by its run directory and identity (see vmm.Adopter). A machine
// that is gone, or whose identity is not the recorded one, is an
// errdefs.ErrNotFound; one that is still waiting for its restore is ended,
// with errdefs.ErrUnavailable. A paused machine is resumed, as a guest an
// earlier daemon left paused in a snapshot.
func (d *Driver) Adopt(ctx context.Context, spec vmm.AdoptSpec) (vmm.Machine, error) {
	cfg, want := spec.MachineConfig, spec.Process
	if cfg.ID == "" || cfg.RunDir == "" || want.PID <= 0 || want.StartTime == 0 {
		return nil, fmt.Errorf("fakevmm adopt %q: need an ID, a run directory, a PID and a start time (got %q, pid %d, start %d): %w",
			cfg.ID, cfg.RunDir, want.PID, want.StartTime, errdefs.ErrInvalidArgument)
	}
	v := lookupVM(cfg.RunDir)
	if v == nil || v.ident != want || v.cfg.ID != cfg.ID {
		return nil, fmt.Errorf("fakevmm %s: adopt: no machine %+v runs in %s: %w", cfg.ID, want, cfg.RunDir, errdefs.ErrNotFound)
	}
	v.ctl.Lock()
	defer v.ctl.Unlock()
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	switch st {
	case stateExited:
		return nil, fmt.Errorf("fakevmm %s: adopt: the machine exited meanwhile: %w", cfg.ID, errdefs.ErrNotFound)
	case statePrepared:
		v.exit(nil)
		return nil, fmt.Errorf("fakevmm %s: adopt: the machine was never restored; ended it: %w", cfg.ID, errdefs.ErrUnavailable)
	case statePaused:
		v.log("fakevmm: adopted a paused machine; resumed it")
		v.run()
	}
	v.log("fakevmm: adopted")
	return &Machine{v: v}, nil
}

// memBytes is the guest memory size of cfg.
func memBytes(cfg vmm.MachineConfig) int64 { return int64(cfg.MemoryMiB) << 20 }

// checkConfig checks what every machine needs.
func checkConfig(cfg vmm.MachineConfig) error {
	if cfg.ID == "" || cfg.RunDir == "" {
		return fmt.Errorf("fakevmm: a machine needs an ID and a run directory (got %q, %q): %w", cfg.ID, cfg.RunDir, errdefs.ErrInvalidArgument)
	}
	if cfg.MemoryMiB <= 0 {
		return fmt.Errorf("fakevmm %s: memory %d MiB: give MemoryMiB > 0: %w", cfg.ID, cfg.MemoryMiB, errdefs.ErrInvalidArgument)
	}
	return nil
}

// checkImage checks that the kernel is a non-empty regular file and that
// the initramfs and root file system, when given, exist.
func checkImage(cfg vmm.MachineConfig) error {
	img := cfg.Image
	fi, err := os.Stat(img.Kernel)
	switch {
	case err != nil:
		return fmt.Errorf("fakevmm %s: kernel: %w: %w", cfg.ID, err, errdefs.ErrInvalidArgument)
	case !fi.Mode().IsRegular() || fi.Size() == 0:
		return fmt.Errorf("fakevmm %s: kernel %s is not a non-empty regular file: %w", cfg.ID, img.Kernel, errdefs.ErrInvalidArgument)
	}
	for _, p := range []string{img.Initrd, img.Rootfs} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("fakevmm %s: image: %w: %w", cfg.ID, err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// createMemoryFile makes a new, zeroed file of size bytes at path,
// replacing any file there.
func createMemoryFile(path string, size int64) (*os.File, error) {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return f, nil
}
