package sandbox

import (
	"fmt"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// cpuLimiter is a machine whose CPU quota can change while it runs (qemu,
// in its cgroup).
type cpuLimiter interface {
	SetCPULimit(millicores int64) error
}

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
	l, ok := m.(cpuLimiter)
	if !ok {
		return fmt.Errorf("this VMM driver cannot limit a sandbox's CPU (cpus): %w", errdefs.ErrNotImplemented)
	}
	return l.SetCPULimit(millicores)
}
