package cgroup

import (
	"errors"
	"fmt"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Limits are one sandbox's resource limits. A zero field sets nothing
// (no limit, or the kernel's default weight).
type Limits struct {
	// MemoryBytes is the hard memory limit. Swap is denied to the group:
	// past the limit the group's own OOM killer kills inside the group.
	MemoryBytes int64
	// CPUMillicores caps CPU time: 1000 is one full CPU, 250 a quarter,
	// 4000 four CPUs (a quota over a 100 ms period).
	CPUMillicores int64
	// CPUWeight is the group's relative CPU share under contention on the
	// cgroup v2 scale, default 100 (v1: cpu.shares = weight*1024/100).
	CPUWeight int64
	// Pids caps the tasks (processes and threads) of the group.
	Pids int64
	// IOWeight is the proportional block I/O weight on the v2 scale,
	// default 100. It needs a weight-aware I/O scheduler (BFQ) or io.cost:
	// where neither exists, a non-zero IOWeight is refused.
	IOWeight int64
}

// The ranges Validate enforces.
const (
	MinMemoryBytes   = 1 << 20 // 1 MiB
	MaxMemoryBytes   = 1 << 50 // 1 PiB
	MinCPUMillicores = 10      // a 1 ms quota per 100 ms period, the kernel's minimum
	MaxCPUMillicores = 1_000_000
	MinWeight        = 1
	MaxWeight        = 10_000
	// MinPids: QEMU needs several threads, and on cgroup v1 Group.Start
	// briefly counts the forking daemon thread in the group.
	MinPids = 8
	MaxPids = 1 << 22 // PID_MAX_LIMIT

	cpuPeriodUs = 100_000
)

// Validate returns every limit out of range, each wrapping
// errdefs.ErrInvalidArgument and naming the limit and its range.
func (l Limits) Validate() error {
	var errs []error
	check := func(name string, v, lo, hi int64, zero string) {
		if v != 0 && (v < lo || v > hi) {
			errs = append(errs, fmt.Errorf("%w: cgroup limit %s=%d is out of range [%d, %d] (0: %s)",
				errdefs.ErrInvalidArgument, name, v, lo, hi, zero))
		}
	}
	check("MemoryBytes", l.MemoryBytes, MinMemoryBytes, MaxMemoryBytes, "no limit")
	check("CPUMillicores", l.CPUMillicores, MinCPUMillicores, MaxCPUMillicores, "no quota")
	check("CPUWeight", l.CPUWeight, MinWeight, MaxWeight, "default weight")
	check("Pids", l.Pids, MinPids, MaxPids, "no limit")
	check("IOWeight", l.IOWeight, MinWeight, MaxWeight, "default weight")
	return errors.Join(errs...)
}

// needs lists the controllers the non-zero limits use.
func (l Limits) needs() []Controller {
	var c []Controller
	if l.MemoryBytes != 0 {
		c = append(c, Memory)
	}
	if l.CPUMillicores != 0 || l.CPUWeight != 0 {
		c = append(c, CPU)
	}
	if l.Pids != 0 {
		c = append(c, Pids)
	}
	if l.IOWeight != 0 {
		c = append(c, IO)
	}
	return c
}

// Weight conversions, as systemd does them.

// cpuShares maps a v2 cpu.weight to v1 cpu.shares (100 -> 1024).
func cpuShares(w int64) int64 { return clamp(w*1024/100, 2, 262144) }

func cpuWeightFromShares(s int64) int64 { return clamp((s*100+512)/1024, MinWeight, MaxWeight) }

// blkioWeight maps an io weight to v1 CFQ blkio.weight (100 -> 500).
func blkioWeight(w int64) int64 { return clamp(w*5, 10, 1000) }

// bfqWeight maps an io weight to BFQ's 1..1000 scale: 1..100 stay,
// 100..10000 shrink to 100..1000.
func bfqWeight(w int64) int64 {
	if w <= 100 {
		return w
	}
	return 100 + (w-100)*900/9900
}

func ioWeightFromBFQ(b int64) int64 {
	if b <= 100 {
		return b
	}
	return 100 + (b-100)*9900/900
}

func clamp(v, lo, hi int64) int64 { return max(lo, min(hi, v)) }
