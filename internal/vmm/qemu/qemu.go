// Package qemu is forkd's VMM driver for QEMU microVMs (-M microvm),
// registered as "qemu". It runs with KVM where the host has it and with
// TCG software emulation everywhere else.
//
// # Templates and clones
//
// Boot with MachineConfig.MemoryFile maps guest RAM shared (share=on) from
// that file, so the file is the template's memory image. Snapshot writes
// only the device state: the migration capability x-ignore-shared skips the
// shared RAM, so it completes in one pass in a few milliseconds. The
// template must then exit (SnapshotSpec.StopAfter), or it would keep
// writing the image its clones map.
//
// Prepare starts a clone's QEMU with the same file mapped private
// (share=off, MAP_PRIVATE: copy-on-write) in -incoming defer, connects QMP,
// sets x-ignore-shared and hands over the state file, so Restore only sends
// migrate-incoming and waits for the guest to run.
//
// The state file travels as a descriptor passed over QMP (SCM_RIGHTS) in
// both directions: from QEMU 9.1 in a descriptor set (add-fd) named by the
// "file:/dev/fdset/N" migration URI, before that by getfd and "fd:NAME",
// which 9.1 deprecated for regular files (handover.go). This keeps QEMU
// from opening paths of forkd's, and from spawning "cat" for exec:
// migration, which the seccomp sandbox (spawn=deny) would forbid.
//
// # Least privilege
//
// Every QEMU runs under -sandbox (seccomp) with obsolete, spawn and
// resourcecontrol denied, in its own process group, and, with Config.UIDs
// (the registered driver's default as root), as a uid of its own that no
// other VMM shares, or with Config.RunAs as a named unprivileged user: QEMU
// opens its files, sockets, tap and memory file as root and then drops to
// that uid before the guest runs. The
// state file of Snapshot and Restore comes over QMP as a descriptor, so the
// dropped process needs no file access at all. With RunAs, the seccomp
// filter has to allow setuid/setgid (elevateprivileges=allow): QEMU
// installs the filter before it drops privileges and would kill itself.
//
// A known weakness of QEMU 7.2: memory-backend-file opens the memory file
// read-write even for share=off (a private mapping). A compromised clone's
// QEMU could write the template image through that descriptor; QEMU 8.2's
// readonly=on with rom=off would open it read-only.
//
// # Clones and vmgenid
//
// QEMU 7.2 accepts -device vmgenid on -M microvm, but the microvm machine
// builds its own ACPI tables and does not describe the device in them (no
// QEMUVGID device reaches the guest), and Debian's cloud kernel is built
// without CONFIG_VMGENID anyway. The driver therefore never adds the device
// and ignores MachineConfig.VMGenID; the guest agent reseeds the kernel RNG
// after each restore instead.
//
// # CPU model and the TCG translation cache
//
// Under KVM the guest gets -cpu host. Under TCG it gets -cpu max: booting
// to the agent took 1.66-2.08 s with max, 1.58-1.85 s with qemu64 and
// 1.64-1.88 s with Skylake-Client (3 boots each, within the noise), and max
// gives guest software (numpy and friends) every instruction set extension.
//
// TCG keeps translated guest code in a buffer of tb-size MiB per process
// (QEMU's default reserves 1 GiB and fills it as the guest runs new code),
// flushed when full. Config.TBSizeMiB bounds it per clone; see
// DefaultTBSizeMiB for the measurements.
package qemu

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"sync"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/jail"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Name is the driver's registry name.
const Name = "qemu"

// DefaultTBSizeMiB is the TCG translation cache per QEMU process when
// Config.TBSizeMiB is zero. Translated code stays resident once written (a
// flush reuses the pages, it does not free them), so the cache size is what
// a long-running clone's translated code can grow to; QEMU's default is
// 1 GiB. Too small a cache is a cliff, not a slope: the code is translated
// again and again.
//
// Measured on the 2-core TCG test host: clones of the busybox test template
// restored one after another, each then running a shell loop over ls, awk,
// sha256sum, sed and ps; medians of 3-5 clones per size. QEMU start to QMP
// ready (33-41 ms), Prepare (37-45 ms), Restore (1.0-1.6 ms) and the first
// agent answer (110-180 ms) did not depend on the size.
//
//	tb-size      workload   RSS      PSS
//	2 MiB        34.1 s     81 MiB   69 MiB
//	4 MiB         6.4 s     83 MiB   71 MiB
//	8 MiB         3.4 s     87 MiB   76 MiB
//	16 MiB        1.30 s    94 MiB   83 MiB
//	64 MiB        1.31 s    96 MiB   84 MiB
//	256 MiB       1.31 s    96 MiB   84 MiB
//	1 GiB (QEMU)  1.26 s    96 MiB   84 MiB
//
// That workload needs 8-16 MiB of translated code. 64 MiB leaves room for
// heavier guests (a Python + pandas clone measured ~60 MiB of QEMU memory
// including translated code) while capping each clone at a sixteenth of
// QEMU's default. Re-measure with TestForkMeasurements when the guest
// workload changes.
const DefaultTBSizeMiB = 64

// Config configures the driver. The zero value is usable: QEMU from PATH,
// automatic accelerator, root, no parent-death signal.
type Config struct {
	// Binary is the QEMU executable (default DefaultBinary from PATH).
	Binary string
	// Accel is the accelerator for machines whose MachineConfig.Accel is
	// empty. Auto picks KVM when /dev/kvm is usable, else TCG.
	Accel vmm.Accel
	// CPU overrides the -cpu model (default: host under KVM, max under TCG).
	CPU string
	// TBSizeMiB is the TCG translation cache size per QEMU process; zero
	// means DefaultTBSizeMiB, negative leaves QEMU's default (1 GiB).
	TBSizeMiB int
	// RunAs is the user QEMU drops to (-runas) once it has opened its
	// files; empty keeps root. The user's tap devices need no owner: QEMU
	// opens the tap before dropping.
	RunAs string
	// UIDs, when its Count is set, gives every QEMU a uid of its own from
	// the range instead of RunAs (see UIDRange). Needs root.
	UIDs UIDRange
	// KillOnParentDeath sends SIGKILL to every QEMU when the process that
	// started it dies (Pdeathsig), for tests and one-shot CLI runs. Off for
	// the daemon, which re-adopts its VMMs after a restart. Linux ties the
	// signal to the starting OS thread, not the process: the driver starts
	// VMMs from threads the Go runtime keeps, except when restoring a
	// thread's network namespace fails (that thread, and the VMM, die).
	// Linux also clears the signal when QEMU changes uid (RunAs, UIDs), so
	// it only holds for QEMU running as root; `forkd bench` runs a
	// watchdog process for that reason.
	KillOnParentDeath bool
	// Jail starts every QEMU in a jail of its own (internal/jail, see
	// jail.go): private root, PID, IPC and UTS namespaces, rlimits, a
	// reduced capability bounding set, no_new_privs. Needs root, and a
	// program that calls jail.Main first thing (JailHelper).
	Jail bool
	// JailHelper is the executable that sets jails up (default: this
	// program, os.Executable).
	JailHelper string
	// Cgroups, when set, puts every QEMU in a cgroup of its own, under
	// its Parent group (default "forkd"), with limits from its guest
	// (cgroup.go).
	Cgroups *cgroup.Config
	// Logger receives lifecycle messages (default slog.Default()).
	Logger *slog.Logger
}

// Driver starts QEMU microVMs. It is safe for concurrent use.
type Driver struct {
	cfg    Config
	binary string
	log    *slog.Logger

	autoAccel func() vmm.Accel
	tscKHz    func() int64

	uids       *uidPool // nil unless Config.UIDs is set
	jailHelper string   // Config.JailHelper resolved; "" without a jail

	// cgMu guards cgManagers: one per directory of run directories
	// (cgroup.go).
	cgMu       sync.Mutex
	cgManagers map[string]*cgroup.Manager

	version    string   // the binary's, from --version
	versionErr error    // why version is unknown
	feat       features // what that version can do
}

var _ vmm.Driver = (*Driver)(nil)

// DefaultRunAs is a shared unprivileged user for tests and callers that set
// Config.RunAs. The registered driver (vmm.Lookup("qemu")) gives each QEMU
// its own uid from DefaultUIDRange instead when forkd runs as root.
// Measured here, dropping costs nothing (QEMU start to QMP ready 34 ms
// either way, median of 5).
const DefaultRunAs = "nobody"

// New returns a driver. It fails if the QEMU binary or the RunAs user
// cannot be found.
func New(cfg Config) (*Driver, error) {
	bin := cfg.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("qemu: %v (install it with: apt-get install qemu-system-x86): %w", err, errdefs.ErrFailedPrecondition)
	}
	switch cfg.Accel {
	case vmm.AccelAuto, vmm.AccelKVM, vmm.AccelTCG:
	default:
		return nil, fmt.Errorf("qemu: accel %q: %w", cfg.Accel, errdefs.ErrInvalidArgument)
	}
	if cfg.RunAs != "" {
		if _, err := user.Lookup(cfg.RunAs); err != nil {
			return nil, fmt.Errorf("qemu: run as %q: %v: %w", cfg.RunAs, err, errdefs.ErrInvalidArgument)
		}
	}
	if cfg.UIDs.Count != 0 {
		if cfg.RunAs != "" {
			return nil, fmt.Errorf("qemu: RunAs %q and a UIDs range both set; pick one: %w", cfg.RunAs, errdefs.ErrInvalidArgument)
		}
		if err := cfg.UIDs.validate(); err != nil {
			return nil, err
		}
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("qemu: a UIDs range needs root (QEMU drops to those uids from root): %w", errdefs.ErrFailedPrecondition)
		}
	}
	helper := ""
	if cfg.Jail {
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("qemu: the VMM jail needs root (mount and PID namespaces); run forkd as root, or pass --no-vmm-jail to run VMMs unconfined: %w", errdefs.ErrFailedPrecondition)
		}
		helper = cfg.JailHelper
		if helper == "" {
			if !jail.MainCalled() {
				return nil, fmt.Errorf("qemu: the jail helper is this program, which does not call jail.Main first thing in main (or TestMain); call it, or set Config.JailHelper: %w", errdefs.ErrFailedPrecondition)
			}
			if helper, err = os.Executable(); err != nil {
				return nil, fmt.Errorf("qemu: the jail helper (this program): %w", err)
			}
		}
	}
	if cfg.Cgroups != nil {
		// The parent group: made now, so a host without the controllers
		// fails here, naming what is missing.
		if _, err := cgroup.New(*cfg.Cgroups); err != nil {
			return nil, fmt.Errorf("qemu: the VMMs' cgroups: %w (or pass --no-vmm-jail to run VMMs unconfined)", err)
		}
	}
	if cfg.TBSizeMiB == 0 {
		cfg.TBSizeMiB = DefaultTBSizeMiB
	}
	if cfg.TBSizeMiB < 0 {
		cfg.TBSizeMiB = 0
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{cfg: cfg, binary: path, log: log.With("vmm", Name), jailHelper: helper}
	// What the binary can do follows from its version; one that does not
	// say (a wrapper script) is taken for the oldest supported, 7.2.
	d.version, d.versionErr = binaryVersion(context.Background(), path)
	d.feat = featuresOf(d.version)
	if d.versionErr != nil {
		d.log.Warn("QEMU version unknown; using only what QEMU 7.2 can do", "binary", path, "err", d.versionErr)
	}
	if cfg.UIDs.Count != 0 {
		d.uids = newUIDPool(cfg.UIDs)
	}
	disableTHPForChildren(d.log)
	d.autoAccel = sync.OnceValue(func() vmm.Accel {
		a, _ := resolveAccel(vmm.AccelAuto)
		return a
	})
	d.tscKHz = sync.OnceValue(func() int64 {
		k, err := hostTSCKHz()
		if err != nil {
			d.log.Warn("host TSC frequency unknown; TCG guests may hang at boot", "err", err)
		}
		return k
	})
	return d, nil
}

// Name returns "qemu".
func (d *Driver) Name() string { return Name }

// Binary is the path of the QEMU executable the driver runs.
func (d *Driver) Binary() string { return d.binary }

// Version returns the QEMU version, e.g. "7.2.22 (Debian
// 1:7.2+dfsg-7+deb12u18+b3)".
func (d *Driver) Version(ctx context.Context) (string, error) {
	if d.versionErr != nil {
		return "", fmt.Errorf("qemu: %w", d.versionErr)
	}
	return d.version, nil
}

// Accel resolves the accelerator a machine with the given setting gets.
func (d *Driver) Accel(a vmm.Accel) (vmm.Accel, error) {
	if a == vmm.AccelAuto {
		a = d.cfg.Accel
	}
	if a == vmm.AccelAuto {
		return d.autoAccel(), nil
	}
	return resolveAccel(a)
}

// Boot starts a fresh VM. With MemoryFile set, guest RAM is a shared
// mapping of that file; the file must not exist yet, or be empty (a
// template's image is never reused: clones may still map it).
func (d *Driver) Boot(ctx context.Context, spec vmm.BootSpec) (vmm.Machine, error) {
	return d.start(ctx, spec.MachineConfig, "")
}

// Prepare starts a QEMU that waits to be restored from spec.StateFile,
// with guest RAM mapped copy-on-write from MemoryFile. It returns once QMP
// is ready and the state file has been handed over.
func (d *Driver) Prepare(ctx context.Context, spec vmm.PrepareSpec) (vmm.Machine, error) {
	if spec.StateFile == "" {
		return nil, fmt.Errorf("qemu prepare %s: no state file: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if spec.MemoryBackend != vmm.MemoryBackendFile {
		// QEMU 7.2 has no external page server for incoming RAM (its
		// postcopy needs a live source QEMU); clones map the file.
		return nil, fmt.Errorf("qemu prepare %s: memory backend %q: QEMU clones map the memory file; use the default file backend: %w",
			spec.ID, spec.MemoryBackend, errdefs.ErrNotImplemented)
	}
	return d.start(ctx, spec.MachineConfig, spec.StateFile)
}

// checkFile fails with NotFound or InvalidArgument for a missing input.
func checkFile(what, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%s %s: %w", what, path, errdefs.ErrNotFound)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s %s: not a regular file: %w", what, path, errdefs.ErrInvalidArgument)
	}
	return nil
}
