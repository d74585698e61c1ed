package bench

// forkd bench branch: BRANCH's pause and cost, diff / full / live, for
// each guest memory size and amount of fresh data the sandbox wrote.

import (
	"context"
	"fmt"
	"time"

	"github.com/forkd-dev/forkd/internal/progress"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// BranchOptions are bench branch's flags.
type BranchOptions struct {
	// Memory is the guest sizes in MiB, comma-separated ("256,1024").
	Memory string
	// Rounds are the branches per mode and size (median reported).
	Rounds int
	// DirtyMB is the MB of fresh data the sandbox writes before it is
	// branched, comma-separated ("0": idle).
	DirtyMB string
}

// Branch runs bench branch: for each size, a snapshot of the minimal
// recipe with that much guest memory (kept as bench-branch-SIZE); for
// each amount, one sandbox forked from it writes that much, idles, and is
// branched o.Rounds times per mode.
func Branch(ctx context.Context, c Config, o BranchOptions) error {
	sizes, err := parseSizes(o.Memory)
	if err != nil {
		return err
	}
	dirties, err := parseDirties(o.DirtyMB)
	if err != nil {
		return err
	}
	env, err := newEnv(c, "branch", nil)
	if err != nil {
		return err
	}
	defer env.close()
	e := env.e
	rep := newReport(ctx, e, "branch", "")
	rep.Intro = fmt.Sprintf("Sandbox of the minimal recipe, idle, after it wrote the fresh data of the \"guest wrote\" column to its tmpfs; %d branches per mode (median); clones' memory %s. "+
		"Pause: diff and full, stop to cont as the caller sees it; live, QEMU's STOP to RESUME events (the guest's own pause).",
		o.Rounds, memoryDirKind(e.Config().MemoryDir))
	rep.columns = []string{"guest memory", "guest wrote", "mode", "pause p50", "pause max", "total p50", "written p50"}
	for _, mib := range sizes {
		snap, err := env.ensureSized(ctx, fmt.Sprintf("bench-branch-%d", mib), mib)
		if err != nil {
			return err
		}
		for _, dirty := range dirties {
			if err := branchModes(ctx, env, rep, snap.Tag, mib, dirty, o.Rounds); err != nil {
				return err
			}
		}
	}
	return c.write(rep)
}

// branchModes forks a sandbox of tag, has it write dirty MB, and branches
// it rounds times in each mode, adding a row per mode.
func branchModes(ctx context.Context, env *runEnv, rep *report, tag string, mib, dirty, rounds int) error {
	e := env.e
	sbs, err := e.Fork(ctx, tag, 1)
	if err != nil {
		return err
	}
	src := sbs[0].ID
	defer e.Kill(ctx, []string{src})
	if dirty > 0 {
		if err := writeFresh(ctx, e, src, "dirty", dirty); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second) // idle: the agent's start-up (or the write's) work is done
	wrote := fmt.Sprintf("%d MB", dirty)
	for _, mode := range []string{sandbox.BranchDiff, sandbox.BranchFull, sandbox.BranchLive} {
		var pauses, totals, written []float64
		var failure error
		for i := 0; i < rounds; i++ {
			tag := fmt.Sprintf("bench-br-%s-%s", mode, snapshot.NewID())
			res, err := e.Branch(ctx, src, sandbox.BranchOptions{Tag: tag, Mode: mode})
			if err != nil {
				failure = err
				break
			}
			pauses = append(pauses, millis(res.Paused))
			totals = append(totals, millis(res.Duration))
			written = append(written, float64(res.BytesWritten))
			if _, err := e.RemoveSnapshotWith(ctx, tag, sandbox.RemoveOptions{Cascade: true}); err != nil {
				return err
			}
		}
		measure := fmt.Sprintf("%d MiB, wrote %s, %s", mib, wrote, mode)
		if failure != nil {
			env.say("%s: %v", measure, failure)
			rep.Rows = append(rep.Rows, reportRow{Measure: measure, Error: failure.Error(),
				cells: []string{fmt.Sprintf("%d MiB", mib), wrote, mode, "unavailable here: " + oneLine(failure.Error(), 140), "", "", ""}})
			continue
		}
		p50, pmax, t50, w50 := percentile(pauses, 0.5), percentile(pauses, 1), percentile(totals, 0.5), percentile(written, 0.5)
		env.say("%s: pause p50 %.1f ms, total p50 %.0f ms", measure, p50, t50)
		rep.Rows = append(rep.Rows, reportRow{
			Measure: measure,
			Value:   fmt.Sprintf("pause p50 %.1f ms, max %.1f ms; total p50 %.0f ms; written p50 %s", p50, pmax, t50, progress.HumanBytes(int64(w50))),
			Values:  vals{"memory_mib": float64(mib), "dirty_mb": float64(dirty), "pause_p50_ms": p50, "pause_max_ms": pmax, "total_p50_ms": t50, "written_p50_bytes": w50},
			cells: []string{fmt.Sprintf("%d MiB", mib), wrote, mode, fmt.Sprintf("%.1f ms", p50), fmt.Sprintf("%.1f ms", pmax),
				fmt.Sprintf("%.0f ms", t50), progress.HumanBytes(int64(w50))},
		})
	}
	return nil
}
