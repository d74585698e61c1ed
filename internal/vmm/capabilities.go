package vmm

// Optional capabilities. A driver or machine implements the Driver and
// Machine contracts and, beyond them, any of the small interfaces below;
// callers type-assert for one and fall back as its doc says when it is
// missing. Each driver asserts the ones it offers at compile time
// (var _ vmm.Adopter = (*Driver)(nil)), and the conformance suite
// (internal/vmm/vmmtest) runs a capability's tests only where it is offered.

import (
	"context"
	"log/slog"
)

// ProcessIdentity identifies a VMM process across daemon restarts. A PID
// alone can be reused by an unrelated process once the VMM has exited; the
// PID plus the process start time (field 22 of /proc/PID/stat, in clock
// ticks since boot) cannot.
type ProcessIdentity struct {
	PID       int
	StartTime uint64
}

// Identifiable is implemented by machines that can report the identity of
// their VMM process, for the engine to record so that a later daemon can
// adopt the process (see Adopter). The identity stays valid after the
// process has exited (PID then returns 0).
type Identifiable interface {
	ProcessIdentity() ProcessIdentity
}

// AdoptSpec describes a running VMM process, started by an earlier daemon,
// to take over: the configuration its Machine reported (Machine.Config)
// and the identity it reported (Identifiable).
type AdoptSpec struct {
	MachineConfig
	Process ProcessIdentity
}

// Adopter is an optional Driver capability: taking over a VMM process that
// an earlier daemon started and left running (a restart, or a daemon killed
// with SIGKILL). Callers type-assert for it; a driver without it cannot
// adopt, and its VMMs should not outlive the daemon.
//
// Adopt returns a running machine that behaves as one the driver started,
// except that its exit status is unknown (the daemon is not the process's
// parent). It fails with an errdefs.ErrNotFound-class error when the process
// is gone or is not the one recorded (its PID was reused). A process that is
// the recorded VMM but cannot be taken over (its control socket does not
// answer, or it is not running a guest) is killed, and Adopt fails with an
// errdefs.ErrUnavailable-class error saying why: nothing is left running
// that no daemon accounts for.
type Adopter interface {
	Adopt(ctx context.Context, spec AdoptSpec) (Machine, error)
}

// LeftoverVMM is a VMM process found by a Lister: its pid and the run dir
// it was started with (MachineConfig.RunDir).
type LeftoverVMM struct {
	PID    int
	RunDir string
}

// Lister is an optional Driver capability: finding the VMM processes this
// driver starts whose run dirs lie under a directory, whoever started them
// (an earlier daemon, a bench run that died), so they can be killed.
// Only processes that are such VMMs are returned, never another process
// that merely names a path under dir (a `tail -f` of a console log).
type Lister interface {
	VMMsUnder(dir string) []LeftoverVMM
}

// Prioritizer is implemented by machines whose CPU priority can change
// after start (every thread of the VMM process).
type Prioritizer interface {
	SetNice(nice int) error
}

// Features are what a driver's snapshots can do beyond a full snapshot of
// a booted machine, for callers that must choose before a machine exists
// (the engine's branch modes, the conformance suite).
type Features struct {
	// DiffSnapshots: Snapshot with SnapshotDiff of a restored, running
	// machine writes a memory image that holds the pages it wrote over
	// its own memory file (SnapshotSpec.PageIndexFile lists them), and
	// the machine runs on. A machine restored from that snapshot sees
	// what the snapshotted one had written.
	DiffSnapshots bool
	// LiveSnapshots: Snapshot with SnapshotLive is offered; whether it
	// works on a given machine is LiveBrancher's answer.
	LiveSnapshots bool
	// DirtyPageTracking: diff snapshots need MachineConfig.TrackDirtyPages
	// set when the machine was booted or prepared (Firecracker). Drivers
	// that find written pages otherwise (QEMU: the pagemap of a private
	// mapping) leave it false.
	DirtyPageTracking bool
	// AgentAfterRestore: a prepared machine's agent channel exists only
	// once its guest runs (Firecracker's vsock device is restored with
	// the snapshot), so DialAgent fails before Restore and callers dial
	// after it. Drivers whose channel is a host socket open before the
	// restore (QEMU's virtio-serial chardev) leave it false, and callers
	// dial ahead, off the fork's path.
	AgentAfterRestore bool
	// UffdMemory: Prepare takes MemoryBackendUffd, and the restored
	// guest's memory is what a page server on PrepareSpec.UffdSocket
	// serves (Firecracker's Uffd backend).
	UffdMemory bool
}

// FeatureReporter is an optional Driver capability: a driver without it
// offers full snapshots only.
type FeatureReporter interface {
	Features() Features
}

// LiveBrancher is an optional Machine capability: telling, before a live
// snapshot (SnapshotLive) is started, whether it can work on this machine
// on this host. LiveBranchSupport returns nil, or an
// errdefs.ErrFailedPrecondition-class error saying what is missing and
// which snapshot type to use instead. A machine without it is trusted to
// fail Snapshot itself.
type LiveBrancher interface {
	LiveBranchSupport() error
}

// LiveBranchHost is an optional Driver capability: host settings that live
// snapshots need (QEMU: vm.unprivileged_userfaultfd for an unprivileged
// QEMU without a userfaultfd device of its own). The daemon calls it once
// at start when live branches are enabled; it logs what it changed on log
// and fails with a message naming the setting when it cannot change it.
type LiveBranchHost interface {
	SetupLiveBranches(log *slog.Logger) error
}

// Pauser is an optional Machine capability: stopping a running guest's
// vCPUs and letting them run again, without a snapshot. Pause and Resume
// are idempotent; both fail on a machine that is not running. A paused
// guest keeps its memory and devices, and answers nothing until resumed.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// RestoreChecker is an optional Driver capability: knowing which versions
// of its VMM (Driver.Version, as recorded with a snapshot) wrote snapshots
// it can restore. CanRestore returns nil, or an
// errdefs.ErrFailedPrecondition-class error naming the versions it reads.
// Without it, only the driver's own version is known to restore.
type RestoreChecker interface {
	CanRestore(version string) error
}

// CPULimiter is an optional Machine capability: changing the CPU quota of
// a running VMM (QEMU: its cgroup's cpu.max), in thousandths of a CPU.
// Without it a sandbox's CPU limit cannot be set.
type CPULimiter interface {
	SetCPULimit(millicores int64) error
}

// GroupCleaner is an optional Driver capability for drivers that keep a
// cgroup (or another host object) per VMM: removing those of run
// directories under dir whose machine ID keep does not accept, after a
// daemon restart. It returns the IDs it removed.
type GroupCleaner interface {
	RemoveLeftoverGroups(ctx context.Context, dir string, keep func(id string) bool) ([]string, error)
}
