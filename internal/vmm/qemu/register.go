package qemu

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// The capabilities the driver and its machines offer beyond vmm.Driver and
// vmm.Machine (internal/vmm/capabilities.go).
var (
	_ vmm.Adopter         = (*Driver)(nil)
	_ vmm.Lister          = (*Driver)(nil)
	_ vmm.FeatureReporter = (*Driver)(nil)
	_ vmm.LiveBranchHost  = (*Driver)(nil)
	_ vmm.RestoreChecker  = (*Driver)(nil)
	_ vmm.GroupCleaner    = (*Driver)(nil)

	_ vmm.Identifiable = (*Machine)(nil)
	_ vmm.LiveBrancher = (*Machine)(nil)
	_ vmm.CPULimiter   = (*Machine)(nil)
)

// DriverConfig is the driver's section of forkd.toml ([driver.qemu]),
// decoded from vmm.Options.Config: the Config fields the daemon has no
// flag for.
type DriverConfig struct {
	// CPU is Config.CPU: the -cpu model (default: host under KVM, max
	// under TCG).
	CPU string `json:"cpu"`
	// TBSizeMiB is Config.TBSizeMiB: the TCG translation cache per QEMU
	// (0: DefaultTBSizeMiB; negative: QEMU's own default, 1 GiB).
	TBSizeMiB int `json:"tb_size_mib"`
	// RunAs is Config.RunAs: one user every QEMU drops to, instead of a
	// uid of its own from DefaultUIDRange (as root). A shared user lets
	// one compromised QEMU signal or ptrace the others; it is for hosts
	// where the uid range is taken.
	RunAs string `json:"run_as"`
}

func init() {
	vmm.Register(Name, vmm.Constructor{New: newFromOptions, Checks: Checks})
}

// newFromOptions is the registered constructor: the daemon's driver.
func newFromOptions(o vmm.Options) (vmm.Driver, error) {
	var dc DriverConfig
	if err := vmm.DecodeConfig(Name, o.Config, &dc); err != nil {
		return nil, err
	}
	cfg := Config{Binary: o.Binary, Accel: o.Accel, Logger: o.Logger, Jail: !o.NoJail,
		CPU: dc.CPU, TBSizeMiB: dc.TBSizeMiB, RunAs: dc.RunAs}
	if os.Geteuid() == 0 && cfg.RunAs == "" {
		cfg.UIDs = DefaultUIDRange
	}
	if cfg.Jail {
		// The jail includes a cgroup per VMM.
		cfg.Cgroups = &cgroup.Config{Logger: o.Logger}
	}
	return New(cfg)
}

// Features reports what the driver's snapshots can do: a running clone
// branches (diff, full or live; branch.go), finding the pages it wrote in
// its own page tables, with no dirty-page tracking to enable.
func (d *Driver) Features() vmm.Features {
	return vmm.Features{DiffSnapshots: true, LiveSnapshots: true}
}

// NeedsUnprivilegedUserfaultfd reports whether live branches need the
// host-wide vm.unprivileged_userfaultfd=1: when QEMU runs unprivileged and
// gets no /dev/userfaultfd node of its own in its jail (QEMU older than
// 8.1, no jail, or a RunAs user instead of a uid of its own).
func (d *Driver) NeedsUnprivilegedUserfaultfd() bool {
	unprivileged := d.uids != nil || d.cfg.RunAs != ""
	ownDevice := d.cfg.Jail && d.feat.uffdDevice && d.uids != nil
	return unprivileged && !ownDevice
}

// unprivilegedUffdKnob is the sysctl that lets a process without
// CAP_SYS_PTRACE create a userfaultfd.
const unprivilegedUffdKnob = "/proc/sys/vm/unprivileged_userfaultfd"

// SetupLiveBranches lets QEMU create the userfaultfd that
// background-snapshot needs: nothing when each QEMU gets a device node of
// its own uid in its jail; else it sets vm.unprivileged_userfaultfd=1
// (host-wide, logged as a warning).
func (d *Driver) SetupLiveBranches(log *slog.Logger) error {
	if log == nil {
		log = d.log
	}
	if !d.NeedsUnprivilegedUserfaultfd() {
		log.Info("live branches: each VMM gets a userfaultfd device of its own uid in its jail; vm.unprivileged_userfaultfd is left as it is")
		return nil
	}
	if v, err := os.ReadFile(unprivilegedUffdKnob); err == nil && strings.TrimSpace(string(v)) != "1" {
		if err := os.WriteFile(unprivilegedUffdKnob, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("--live-branch: QEMU runs unprivileged and needs %s = 1 to create a userfaultfd: %v", unprivilegedUffdKnob, err)
		}
		log.Warn("set vm.unprivileged_userfaultfd=1 for live branches: unprivileged processes on this host may now create userfaultfds", "knob", unprivilegedUffdKnob)
	}
	return nil
}
