// Package vmm is the contract between forkd's sandbox engine and a virtual
// machine monitor, plus a registry of drivers (qemu now, firecracker on KVM
// hosts).
//
// # Lifecycle
//
// A Machine is one VMM process running (or about to run) one microVM. It is
// created in one of two ways:
//
//   - Driver.Boot starts a fresh VM from an image (kernel, initramfs, root
//     file system). It is used to build templates and for cold-boot
//     measurements. With BootSpec.MemoryFile set, guest RAM is a shared
//     mapping of that file, so the file *is* the memory image when the VM is
//     snapshotted (QEMU's "VM templating"); Firecracker writes the file at
//     snapshot time instead.
//   - Driver.Prepare starts a VMM process that waits to be restored from a
//     snapshot. Starting the process is the slow part of a fork (~150 ms for
//     QEMU here), so the engine keeps a small pool of prepared machines per
//     snapshot and calls Restore on the critical path only. The memory file is
//     mapped copy-on-write (MAP_PRIVATE): children share the template's pages
//     until they write them.
//
// States: prepared -> running (after Restore) -> exited. Boot yields a running
// machine. Snapshot is legal only while running. Stop and Kill are legal in
// every state and idempotent; Done is closed once the process has exited and
// been reaped, after which ExitError is final.
//
// A Machine's lifetime is not tied to the context of the call that created
// it: contexts bound only the call itself. A request that forks a sandbox
// must not own its VMM process.
package vmm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Accel selects how guest code runs.
type Accel string

const (
	AccelAuto Accel = ""    // KVM when usable, else TCG
	AccelKVM  Accel = "kvm" // hardware virtualization
	AccelTCG  Accel = "tcg" // QEMU software emulation (no /dev/kvm)
)

// Image is what a VM boots: the files of a built guest image.
type Image struct {
	Kernel string // bzImage / vmlinux
	Initrd string // initramfs with forkd-agent as /init
	Rootfs string // read-only ext4, attached as the first virtio-blk disk
	// KernelArgs are appended to the driver's own kernel command line.
	KernelArgs []string
}

// Network attaches the VM to a tap device inside a network namespace.
type Network struct {
	// NetNSPath is the namespace the VMM process runs in (e.g.
	// /run/netns/forkd-abc). Empty: the caller's namespace.
	NetNSPath string
	TapName   string // tap device inside that namespace
	MAC       string // guest MAC; identical in every child of a template
}

// MachineConfig is shared by Boot and Prepare. A restored machine must use
// the same MemoryMiB, VCPUs, Image and device set as the machine that was
// snapshotted.
type MachineConfig struct {
	ID        string // unique; names the run files
	RunDir    string // directory for sockets, console log, pid file (created)
	Image     Image
	MemoryMiB int
	VCPUs     int
	Accel     Accel
	Network   *Network // nil: no NIC
	// MemoryFile is the template's memory image. Boot: where a snapshot
	// that names no SnapshotSpec.MemoryFile leaves guest memory, either
	// because RAM is that file mapped shared from the start (QEMU) or
	// because the driver writes it there at snapshot time (Firecracker);
	// the engine relies on nothing else and checks
	// SnapshotResult.MemoryFile. Prepare: mapped private, copy-on-write.
	MemoryFile string
	// VMGenID is a fresh 128-bit UUID per child where the VMM supports a
	// vmgenid device; it tells the guest kernel it was cloned.
	VMGenID string
	// ConsoleLog receives the guest serial console (appended). A guest
	// can print without end: the driver keeps it capped (QEMU: the latest
	// 1 MiB at most, in ConsoleLog and ConsoleLog.1).
	ConsoleLog string
	// TrackDirtyPages asks the VMM to track the pages the guest writes, for
	// a later diff snapshot. Firecracker needs it at boot and restore
	// (machine-config and snapshot/load track_dirty_pages); QEMU reads
	// written pages of a private mapping from /proc/PID/pagemap and ignores
	// it.
	TrackDirtyPages bool
	// Nice is the CPU niceness the VMM process starts with (0: normal).
	// Pool refills start VMMs at a low priority so they yield to running
	// sandboxes; Prioritizer resets it when one is taken.
	Nice int
	// DiskRead caps the guest's reads of its root disk (the only disk,
	// read-only: a guest's writes stay in its memory); zero fields set no
	// limit. Firecracker: the drive's rate_limiter.
	DiskRead RateLimit
}

// RateLimit is a token bucket's rate: bytes and operations per second.
type RateLimit struct {
	BytesPerSec int64
	OpsPerSec   int64
}

// BootSpec starts a fresh VM.
type BootSpec struct {
	MachineConfig
}

// MemoryBackend says where a restored guest's memory comes from.
type MemoryBackend string

const (
	// MemoryBackendFile maps MachineConfig.MemoryFile copy-on-write
	// (QEMU's share=off, Firecracker's mem_backend File).
	MemoryBackendFile MemoryBackend = ""
	// MemoryBackendUffd registers guest memory with userfaultfd and hands
	// every first touch of a page to a page server listening on
	// PrepareSpec.UffdSocket (Firecracker's mem_backend Uffd). A page
	// server can serve a diff chain's layers without assembling them, or
	// pages from another host. Drivers without it return ErrNotImplemented
	// from Prepare.
	MemoryBackendUffd MemoryBackend = "uffd"
)

// PrepareSpec starts a VMM process that waits to be restored.
type PrepareSpec struct {
	MachineConfig
	// StateFile is the device-state file of the snapshot to restore.
	StateFile string
	// MemoryBackend selects how guest memory is served (default: the file).
	MemoryBackend MemoryBackend
	// UffdSocket is the page server's Unix socket, for MemoryBackendUffd.
	UffdSocket string
}

// SnapshotType is the kind of snapshot to take.
type SnapshotType string

const (
	SnapshotFull SnapshotType = "full"
	SnapshotDiff SnapshotType = "diff"
	// SnapshotLive captures a running machine's memory as of one instant
	// while it keeps running (QEMU: background-snapshot); the pause is only
	// the device-state save.
	SnapshotLive SnapshotType = "live"
)

// SnapshotSpec says where a snapshot goes.
type SnapshotSpec struct {
	Type SnapshotType
	// StateFile receives the device state (created, fsynced).
	StateFile string
	// MemoryFile receives guest memory for drivers that write it at snapshot
	// time (Firecracker). Drivers whose RAM already lives in
	// MachineConfig.MemoryFile (QEMU templating) leave it and report that
	// path in SnapshotResult.MemoryFile.
	MemoryFile string
	// StopAfter ends the VM after the snapshot. Required for QEMU templating:
	// a running template would keep writing the shared memory file.
	StopAfter bool
	// PageIndexFile, optional, receives the list of guest pages a diff
	// snapshot of a clone copied from the running VM rather than from the
	// memory file the clone was started from (package memlayer's format):
	// every page in which MemoryFile differs from that file (and a few that
	// were written back unchanged).
	PageIndexFile string
	// Layer (diff only; needs PageIndexFile) makes MemoryFile a layer
	// instead of a complete image: a sparse file holding only the pages
	// of PageIndexFile, at their offsets. The complete image is the
	// clone's own memory file with those pages put over it (package
	// memlayer), so the branch copies neither the base nor its holes.
	Layer bool
}

// SnapshotResult describes a written snapshot.
type SnapshotResult struct {
	StateFile  string
	MemoryFile string
	// Paused is how long the guest was stopped (zero for a live save).
	Paused   time.Duration
	Duration time.Duration
	// BytesWritten is how much the snapshot wrote to its files (memory
	// data, including a copy of the parent's data, and state).
	BytesWritten int64
	// DirtyPages is how many guest pages the snapshot took from the
	// running VM: the pages a clone wrote (diff; full, where the rest came
	// from the clone's memory file), or the pages with data (live, and a
	// full branch that had to copy all of RAM).
	DirtyPages int64
	// PageIndexFile is SnapshotSpec.PageIndexFile once written.
	PageIndexFile string
}

// RestoreTimings breaks a restore down for metrics and benchmarks.
type RestoreTimings struct {
	Load  time.Duration // device state loaded, guest running
	Total time.Duration
}

// Machine is one VMM process. See the package doc for its lifecycle.
type Machine interface {
	ID() string
	// PID of the VMM process (0 once reaped).
	PID() int
	Config() MachineConfig
	// DialAgent connects to the guest agent's stream. It may be called before
	// Restore (the bytes flow once the guest runs) unless the driver's
	// Features say AgentAfterRestore. One connection at a time.
	DialAgent(ctx context.Context) (net.Conn, error)
	// Restore loads the snapshot of a prepared machine and lets it run.
	// On failure (a missing or corrupt snapshot) the machine is killed:
	// nothing is left running that the caller would have to stop.
	Restore(ctx context.Context) (RestoreTimings, error)
	Snapshot(ctx context.Context, spec SnapshotSpec) (SnapshotResult, error)
	// Stop asks the VMM to quit, then kills it after the context ends.
	Stop(ctx context.Context) error
	// Kill ends the VMM process at once.
	Kill() error
	// Done is closed when the process has exited.
	Done() <-chan struct{}
	// ExitError is why the process exited (nil for a requested stop).
	ExitError() error
	// ConsoleTail returns up to n bytes from the end of the guest console,
	// escaped for a terminal (EscapeConsole): the guest wrote it.
	ConsoleTail(n int) string
}

// Driver creates machines of one VMM kind.
type Driver interface {
	// Name is the registry name ("qemu", "firecracker").
	Name() string
	// Version is the VMM binary's version (recorded in snapshot manifests).
	Version(ctx context.Context) (string, error)
	// Boot starts a fresh VM and returns once the VMM process runs.
	Boot(ctx context.Context, spec BootSpec) (Machine, error)
	// Prepare starts a VMM process waiting to be restored.
	Prepare(ctx context.Context, spec PrepareSpec) (Machine, error)
}

// Check is one host prerequisite probed by a driver (for `forkd doctor`).
type Check struct {
	Name   string
	OK     bool
	Detail string
	Fix    string // how to fix it when !OK
}

// Constructor builds a driver; registered once per VMM kind.
type Constructor struct {
	// New returns a driver with the given options.
	New func(Options) (Driver, error)
	// Checks probes the host for this driver's prerequisites.
	Checks func(ctx context.Context, opts Options) []Check
}

// Options are shared by all drivers; each field names who uses it.
type Options struct {
	// Binary overrides the VMM executable (qemu: qemu-system-x86_64).
	Binary string
	// Accel is the default accelerator (qemu). Auto picks KVM when usable.
	Accel Accel
	// NoJail runs VMMs without their jail (qemu: mount, PID, IPC and UTS
	// namespaces, rlimits, capabilities): an explicit operator choice
	// (`forkd serve --no-vmm-jail`), which doctor reports.
	NoJail bool
	// Logger receives the driver's messages (nil: slog.Default()); the
	// daemon passes its own, so that its log level applies.
	Logger *slog.Logger
	// Config is the driver's own settings: its section of forkd.toml
	// ([driver.qemu] for qemu), keys as written there. The driver decodes
	// it (DecodeConfig) and rejects a key it does not know. Nil: defaults.
	Config map[string]any
}

var (
	mu       sync.Mutex
	registry = map[string]Constructor{}
)

// Register makes a driver available by name. It panics on a duplicate, as
// registration happens in init functions.
func Register(name string, c Constructor) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registry[name]; dup {
		panic("vmm: driver registered twice: " + name)
	}
	registry[name] = c
}

// List returns the registered driver names, sorted.
func List() []string {
	mu.Lock()
	defer mu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the constructor of a driver.
func Lookup(name string) (Constructor, error) {
	mu.Lock()
	c, ok := registry[name]
	mu.Unlock()
	if !ok {
		return Constructor{}, fmt.Errorf("vmm driver %q (known: %v): %w", name, List(), errdefs.ErrNotFound)
	}
	return c, nil
}
