package firecracker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Name is the driver's registry name.
const Name = "firecracker"

// WrittenAgainst is the Firecracker API version the driver's requests are
// written for and contract-tested against (fctest's firecracker.yaml).
const WrittenAgainst = "1.17.0-dev"

// MinVersion is the oldest Firecracker doctor accepts. It is an estimate
// of the first release whose API has every field the driver sends
// (snapshot/load's mem_backend, network_overrides, vsock_override,
// clock_realtime), not checked against older API descriptions.
const MinVersion = "1.14.0"

// Default binaries, looked up in PATH.
const (
	DefaultBinary = "firecracker"
	DefaultJailer = "jailer"
)

// AgentVsockPort is the guest vsock port the agent listens on under
// Firecracker; DialAgent sends "CONNECT <port>" for it.
const AgentVsockPort = agentapi.VsockPort

// DefaultJailUID is the uid and gid the jailer drops every Firecracker
// to when Config.UID is zero: outside QEMU's uid range, owned by no user.
const DefaultJailUID = 1_999_000_000

// Config configures the driver. The zero value needs the jailer (and
// root); running Firecracker without it takes NoJailer.
type Config struct {
	// Binary is the firecracker executable (default DefaultBinary).
	Binary string
	// Jailer is the jailer executable (default DefaultJailer).
	Jailer string
	// NoJailer runs Firecracker directly, without chroot, uid/gid drop,
	// cgroups or namespaces: an explicit choice (--no-vmm-jail).
	NoJailer bool
	// ChrootBase is the jailer's --chroot-base-dir (default /srv/jailer).
	// Kernel, root file system and snapshot files are hard-linked into
	// each jail, so they must live on the same file system.
	ChrootBase string
	// UID and GID the jailer drops to (default DefaultJailUID).
	UID, GID int
	// LayerMiB, when set, gives each machine a writable disk of that
	// size (the second virtio-blk disk, /dev/vdb) next to the read-only
	// root: a sparse file in the run dir, copied into every child.
	LayerMiB int
	// NoClockRealtime keeps a restored guest's kvmclock where it was at
	// the snapshot; by default it is advanced by the wall-clock time
	// since (snapshot/load clock_realtime).
	NoClockRealtime bool
	// Logger receives lifecycle messages (default slog.Default()).
	Logger *slog.Logger
}

// Driver starts Firecracker microVMs. It is safe for concurrent use.
type Driver struct {
	cfg    Config
	binary string
	jailer string // "" with NoJailer
	log    *slog.Logger

	versionOnce sync.Once
	version     string
	versionErr  error
}

var (
	_ vmm.Driver          = (*Driver)(nil)
	_ vmm.FeatureReporter = (*Driver)(nil)
)

// newFromOptions is the registered constructor: the daemon's driver.
func newFromOptions(o vmm.Options) (vmm.Driver, error) {
	var dc DriverConfig
	if err := vmm.DecodeConfig(Name, o.Config, &dc); err != nil {
		return nil, err
	}
	if dc.UID < 0 || dc.GID < 0 || (dc.UID == 0) != (dc.GID == 0) {
		return nil, fmt.Errorf("[driver.%s]: uid %d, gid %d: set both to a uid and gid above 0 (default %d), or neither: %w", Name, dc.UID, dc.GID, DefaultJailUID, errdefs.ErrInvalidArgument)
	}
	return New(Config{Binary: o.Binary, NoJailer: o.NoJail, Logger: o.Logger,
		Jailer: dc.Jailer, ChrootBase: dc.ChrootBase, UID: dc.UID, GID: dc.GID,
		LayerMiB: dc.LayerMiB, NoClockRealtime: dc.NoClockRealtime})
}

// Features: diff snapshots need dirty page tracking from boot or restore;
// the agent's vsock exists once the guest runs, so it is dialled after
// Restore. Diff snapshots are not offered to the engine yet: they write
// no page index (Snapshot refuses PageIndexFile).
func (d *Driver) Features() vmm.Features {
	return vmm.Features{DiffSnapshots: true, DirtyPageTracking: true, AgentAfterRestore: true, UffdMemory: true}
}

// DriverConfig is the [driver.firecracker] section of forkd.toml: the
// Config fields an operator sets (keys as written there).
type DriverConfig struct {
	Jailer          string `json:"jailer"`
	ChrootBase      string `json:"chroot_base"`
	UID             int    `json:"uid"`
	GID             int    `json:"gid"`
	LayerMiB        int    `json:"layer_mib"`
	NoClockRealtime bool   `json:"no_clock_realtime"`
}

func init() {
	vmm.Register(Name, vmm.Constructor{New: newFromOptions, Checks: Checks})
}

// New returns a driver. It fails, saying what to install, when a binary
// is missing.
func New(cfg Config) (*Driver, error) {
	bin := cfg.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("firecracker: %v (%s): %w", err, installHint, errdefs.ErrFailedPrecondition)
	}
	d := &Driver{cfg: cfg, binary: path}
	if !cfg.NoJailer {
		j := cfg.Jailer
		if j == "" {
			j = DefaultJailer
		}
		if d.jailer, err = exec.LookPath(j); err != nil {
			return nil, fmt.Errorf("firecracker: the jailer: %v (%s; or pass --no-vmm-jail to run Firecracker unjailed): %w", err, installHint, errdefs.ErrFailedPrecondition)
		}
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("firecracker: the jailer needs root (chroot, uid drop, cgroups); run forkd as root, or pass --no-vmm-jail: %w", errdefs.ErrFailedPrecondition)
		}
		if d.cfg.ChrootBase == "" {
			d.cfg.ChrootBase = "/srv/jailer"
		}
		if d.cfg.UID == 0 {
			d.cfg.UID, d.cfg.GID = DefaultJailUID, DefaultJailUID
		}
	}
	if cfg.LayerMiB < 0 {
		return nil, fmt.Errorf("firecracker: LayerMiB %d: %w", cfg.LayerMiB, errdefs.ErrInvalidArgument)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d.log = log.With("vmm", Name)
	return d, nil
}

// installHint says where Firecracker comes from.
const installHint = "install firecracker and jailer " + MinVersion + " or newer (written against the " + WrittenAgainst +
	" API) from https://github.com/firecracker-microvm/firecracker/releases into PATH"

// Name returns "firecracker".
func (d *Driver) Name() string { return Name }

// Version returns the binary's version from `firecracker --version`.
func (d *Driver) Version(ctx context.Context) (string, error) {
	d.versionOnce.Do(func() { d.version, d.versionErr = binaryVersion(ctx, d.binary) })
	return d.version, d.versionErr
}

// Boot starts a fresh microVM: it configures the machine, its disks,
// network, vsock and entropy device over the API and starts the guest.
// MachineConfig.MemoryFile is not mapped: Firecracker writes guest memory
// at snapshot time (into SnapshotSpec.MemoryFile, or this file when that
// is empty).
func (d *Driver) Boot(ctx context.Context, spec vmm.BootSpec) (vmm.Machine, error) {
	if err := checkConfig(spec.MachineConfig); err != nil {
		return nil, err
	}
	m, err := d.start(ctx, spec.MachineConfig)
	if err != nil {
		return nil, err
	}
	if err := m.boot(ctx); err != nil {
		m.Kill()
		return nil, fmt.Errorf("firecracker boot %s: %w%s", spec.ID, err, m.exitDetail())
	}
	return m, nil
}

// Prepare starts a fresh Firecracker process for a restore: the snapshot
// is loaded by Restore (snapshot/load must be the first configuration a
// process gets).
func (d *Driver) Prepare(ctx context.Context, spec vmm.PrepareSpec) (vmm.Machine, error) {
	if err := checkConfig(spec.MachineConfig); err != nil {
		return nil, err
	}
	if spec.StateFile == "" {
		return nil, fmt.Errorf("firecracker prepare %s: no state file: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	switch spec.MemoryBackend {
	case vmm.MemoryBackendFile:
		if spec.MemoryFile == "" {
			return nil, fmt.Errorf("firecracker prepare %s: the file memory backend needs MemoryFile: %w", spec.ID, errdefs.ErrInvalidArgument)
		}
	case vmm.MemoryBackendUffd:
		if spec.UffdSocket == "" {
			return nil, fmt.Errorf("firecracker prepare %s: the uffd memory backend needs the page server's UffdSocket: %w", spec.ID, errdefs.ErrInvalidArgument)
		}
	default:
		return nil, fmt.Errorf("firecracker prepare %s: memory backend %q: %w", spec.ID, spec.MemoryBackend, errdefs.ErrInvalidArgument)
	}
	m, err := d.start(ctx, spec.MachineConfig)
	if err != nil {
		return nil, err
	}
	m.restore = &spec
	if err := m.prepareLayer(); err != nil {
		m.Kill()
		return nil, fmt.Errorf("firecracker prepare %s: %w", spec.ID, err)
	}
	return m, nil
}

func checkConfig(c vmm.MachineConfig) error {
	switch {
	case c.ID == "" || c.RunDir == "":
		return fmt.Errorf("firecracker: a machine needs an ID and a RunDir: %w", errdefs.ErrInvalidArgument)
	case c.Accel == vmm.AccelTCG:
		return fmt.Errorf("firecracker %s: Firecracker runs only under KVM; use --vmm qemu for TCG: %w", c.ID, errdefs.ErrInvalidArgument)
	case c.VCPUs < 1 || c.VCPUs > 32 || (c.VCPUs > 1 && c.VCPUs%2 == 1):
		return fmt.Errorf("firecracker %s: %d vCPUs: Firecracker takes 1 or an even number up to 32: %w", c.ID, c.VCPUs, errdefs.ErrInvalidArgument)
	case c.MemoryMiB < 1:
		return fmt.Errorf("firecracker %s: memory %d MiB: %w", c.ID, c.MemoryMiB, errdefs.ErrInvalidArgument)
	}
	return nil
}
