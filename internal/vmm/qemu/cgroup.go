package qemu

// Each QEMU in a cgroup of its own (internal/cgroup), named by its
// machine ID under the daemon's group: memory (hard, no swap), CPU quota
// and pids limits. It joins the group before its first instruction (the
// jail helper writes itself in; unjailed, cgroup.Group.Start forks into
// it). An exit the group's OOM killer caused is described as such.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Limits of a VMM's cgroup beyond its guest's memory and vCPUs.
const (
	// vmmOverheadMiB is QEMU's own memory on top of guest RAM and the TCG
	// translation cache: device state, buffers, libraries (measured:
	// 30–60 MiB of private memory per clone).
	vmmOverheadMiB = 192
	// vmmPids bounds QEMU's threads (vCPUs, I/O workers, RCU, migration):
	// it spawns no processes (seccomp spawn=deny).
	vmmPids = 256
	// vmmExtraMillicores is the CPU beyond one core per vCPU: QEMU's main
	// loop and I/O threads.
	vmmExtraMillicores = 500
)

// cgroupDeleteTimeout bounds removing a group after its VMM has exited.
const cgroupDeleteTimeout = 10 * time.Second

// vmmLimits are the cgroup limits of l's QEMU.
func vmmLimits(l *launch) cgroup.Limits {
	return cgroup.Limits{
		MemoryBytes:   int64(l.cfg.MemoryMiB+l.tbSize+vmmOverheadMiB) << 20,
		CPUMillicores: int64(l.cfg.VCPUs)*1000 + vmmExtraMillicores,
		Pids:          vmmPids,
	}
}

// groups is the cgroup manager of the machines whose run directories
// are in dir (one engine's): a group "<parent>/<hash of dir>" under the
// driver's, so that engines sharing a host (tests, a bench beside a
// daemon) each find and clean only their own machines' groups. nil when
// the driver has no cgroups.
func (d *Driver) groups(dir string) (*cgroup.Manager, error) {
	if d.cfg.Cgroups == nil {
		return nil, nil
	}
	d.cgMu.Lock()
	defer d.cgMu.Unlock()
	if m := d.cgManagers[dir]; m != nil {
		return m, nil
	}
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	cfg := *d.cfg.Cgroups
	cfg.Parent = path.Join(cgroupParent(cfg), hex.EncodeToString(sum[:6]))
	m, err := cgroup.New(cfg)
	if err != nil {
		return nil, err
	}
	if d.cgManagers == nil {
		d.cgManagers = map[string]*cgroup.Manager{}
	}
	d.cgManagers[dir] = m
	return m, nil
}

// cgroupParent is cfg's parent group, its default filled in.
func cgroupParent(cfg cgroup.Config) string {
	if cfg.Parent == "" {
		return "forkd"
	}
	return cfg.Parent
}

// newGroup creates the cgroup of l's QEMU; nil when the driver has no
// cgroups. A group left by a daemon that crashed, under the same ID, is
// emptied and replaced.
func (d *Driver) newGroup(ctx context.Context, l *launch) (*cgroup.Group, error) {
	mgr, err := d.groups(filepath.Dir(l.cfg.RunDir))
	if mgr == nil || err != nil {
		return nil, err
	}
	g, err := mgr.Create(l.cfg.ID, vmmLimits(l))
	if errdefs.IsAlreadyExists(err) {
		if old, oerr := mgr.Open(l.cfg.ID); oerr == nil {
			if derr := old.Delete(ctx, true); derr != nil {
				return nil, fmt.Errorf("qemu %s: a leftover cgroup of the same name: %w", l.cfg.ID, derr)
			}
		}
		g, err = mgr.Create(l.cfg.ID, vmmLimits(l))
	}
	if err != nil {
		return nil, fmt.Errorf("qemu %s: %w", l.cfg.ID, err)
	}
	return g, nil
}

// openGroup finds the cgroup of an adopted machine; nil if it has none.
func (d *Driver) openGroup(cfg vmm.MachineConfig) *cgroup.Group {
	mgr, err := d.groups(filepath.Dir(cfg.RunDir))
	if mgr == nil || err != nil {
		return nil
	}
	g, err := mgr.Open(cfg.ID)
	if err != nil {
		return nil
	}
	return g
}

// removeGroup deletes an exited machine's cgroup, first noting whether
// its OOM killer ended QEMU (m.mu is not held).
func (m *Machine) removeGroup() (oomKilled bool) {
	if m.cg == nil {
		return false
	}
	oomKilled, _ = m.cg.OOMKilled() // counted before the SIGKILL was sent
	ctx, cancel := context.WithTimeout(context.Background(), cgroupDeleteTimeout)
	defer cancel()
	if err := m.cg.Delete(ctx, true); err != nil {
		m.d.log.Warn("could not remove the vmm's cgroup", "id", m.cfg.ID, "err", err)
	}
	return oomKilled
}

// oomDetail says why an OOM-killed QEMU died.
func (m *Machine) oomDetail() string {
	return fmt.Sprintf("killed by the host's OOM killer: the VMM reached its cgroup's memory limit of %d MiB (guest %d MiB plus VMM overhead)",
		m.cgMemMiB, m.cfg.MemoryMiB)
}

// RemoveLeftoverGroups deletes, killing what runs in them, the cgroups
// of machines whose run directories are in dir and whose ID keep
// rejects: what a daemon that died left (a restarted daemon keeps its
// adopted machines').
func (d *Driver) RemoveLeftoverGroups(ctx context.Context, dir string, keep func(id string) bool) ([]string, error) {
	mgr, err := d.groups(dir)
	if mgr == nil || err != nil {
		return nil, err
	}
	return mgr.Cleanup(ctx, keep)
}

// removeCgroups deletes every group of this driver's machines and their
// parents (tests).
func (d *Driver) removeCgroups(ctx context.Context) error {
	d.cgMu.Lock()
	defer d.cgMu.Unlock()
	var errs []error
	for dir, m := range d.cgManagers {
		errs = append(errs, m.Remove(ctx))
		delete(d.cgManagers, dir)
	}
	return errors.Join(errs...)
}

// SetCPULimit changes the CPU quota of the machine's cgroup (millicores,
// 1000 = one CPU): for a fork that asks for less CPU than its VMM was
// pooled with.
func (m *Machine) SetCPULimit(millicores int64) error {
	if m.cg == nil {
		return fmt.Errorf("qemu %s: no cgroup to limit its CPU in (the daemon runs with --no-vmm-jail): %w", m.cfg.ID, errdefs.ErrFailedPrecondition)
	}
	if err := m.cg.SetCPU(millicores); err != nil {
		return fmt.Errorf("qemu %s: %w", m.cfg.ID, err)
	}
	return nil
}
