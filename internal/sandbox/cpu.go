package sandbox

import (
	"fmt"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// checkCPU bounds a fork's CPU: at least MinCPUMillicores, at most one CPU
// per vCPU of its snapshot (more could not be used; the default adds half
// a CPU for the VMM's own threads).
func checkCPU(millicores int64, vcpus int) error {
	if millicores == 0 {
		return nil
	}
	if millicores < MinCPUMillicores || millicores > int64(vcpus)*1000 {
		return fmt.Errorf("cpus %g: want %g to %d (the snapshot's vCPUs), or none for the default of %d.5: %w",
			float64(millicores)/1000, float64(MinCPUMillicores)/1000, vcpus, vcpus, errdefs.ErrInvalidArgument)
	}
	return nil
}

// setCPULimit caps m's CPU at millicores.
func setCPULimit(m vmm.Machine, millicores int64, vcpus int) error {
	if err := checkCPU(millicores, vcpus); err != nil {
		return err
	}
	l, ok := m.(vmm.CPULimiter)
	if !ok {
		return fmt.Errorf("this VMM driver cannot limit a sandbox's CPU (cpus): %w", errdefs.ErrNotImplemented)
	}
	return l.SetCPULimit(millicores)
}

// applyCPULimit caps a child's VMM before its guest runs, pooled or not:
// at what the fork asked for, else at its snapshot's default (its
// recipe's cpus), and returns the limit in force (0: the VMM's default).
// A snapshot's default that this driver cannot apply (no cgroups: the
// operator ran --no-vmm-jail) is logged and left; one the fork asked for
// fails the fork.
func (e *Engine) applyCPULimit(pv *prepared, snap *snapshot.Snapshot, asked int64) (int64, error) {
	limit := asked
	if limit == 0 {
		limit = snap.CPUMillicores
	}
	if limit == 0 {
		return 0, nil
	}
	err := setCPULimit(pv.machine, limit, snap.VCPUs)
	if err != nil && asked == 0 && (errdefs.IsNotImplemented(err) || errdefs.IsFailedPrecondition(err)) {
		e.log.Warn("the snapshot's CPU limit is not applied", "sandbox_id", pv.id, "tag", snap.Tag, "err", err)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return limit, nil
}
