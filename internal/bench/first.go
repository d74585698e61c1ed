package bench

// forkd bench first-answer: from a fork request to a child's first real
// answer, per phase and in CPU, for each way of pooling (issue #20).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// FirstAnswerOptions are bench first-answer's flags.
type FirstAnswerOptions struct {
	// Tag is the snapshot forked (it needs a Python session), created
	// from Recipe if missing.
	Tag, Recipe string
	// Code is the first request.
	Code string
	// Modes are the pooling modes measured, in this order, comma-separated
	// (off, started, restored).
	Modes string
	// Sequential children (K) and children forked at once (N).
	Sequential, Concurrent int
	// PoolWait is the longest wait for the pool to fill before each fork.
	PoolWait time.Duration
}

// poolModes are the ways of pooling first-answer compares.
var poolModes = map[string]string{
	"off":      "no pool: every fork starts its VMM and restores",
	"started":  "pooled VMMs started, restored on the fork's path (--pool-start-only)",
	"restored": "pooled VMMs restored ahead, first request rehearsed (the default)",
}

// FirstAnswer runs bench first-answer: for each pooling mode in turn, an
// engine of its own with that pool (c.PoolSize VMMs in the started and
// restored modes), K sequential children each asked o.Code twice, then N
// children forked at once.
func FirstAnswer(ctx context.Context, c Config, o FirstAnswerOptions) error {
	var modes []string
	for _, m := range strings.Split(o.Modes, ",") {
		m = strings.TrimSpace(m)
		if _, ok := poolModes[m]; !ok {
			return fmt.Errorf("--modes: unknown mode %q (off, started, restored): %w", m, errdefs.ErrInvalidArgument)
		}
		modes = append(modes, m)
	}
	if o.Sequential < 1 || o.Concurrent < 1 {
		return fmt.Errorf("--sequential and --concurrent must be at least 1: %w", errdefs.ErrInvalidArgument)
	}
	var rep *report
	p50s := map[string]float64{}
	for _, mode := range modes {
		mc := c
		mc.PoolStartOnly = mode == "started"
		if mode == "off" {
			mc.PoolSize = 0
		}
		env, err := newEnv(mc, "first", nil)
		if err != nil {
			return err
		}
		snap, err := env.ensureSnapshot(ctx, o.Tag, o.Recipe)
		if err == nil && !snap.Python.Enabled {
			err = fmt.Errorf("snapshot %s has no Python session: give a --tag or --recipe with one: %w", o.Tag, errdefs.ErrInvalidArgument)
		}
		if err != nil {
			env.close()
			return err
		}
		if rep == nil {
			rep = newReport(ctx, env.e, "first-answer", string(snap.VMM.Accel))
			rep.Setup = fmt.Sprintf("snapshot `%s` (recipe %s, %d MiB, %d vCPU); pool %d; first request `%s`; network %s",
				snap.Tag, snap.Image.Recipe, snap.MemoryMiB, snap.VCPUs, c.PoolSize, o.Code, c.Network)
		}
		env.say("mode %s: %s", mode, poolModes[mode])
		p50, err := firstMode(ctx, env, snap, mode, mc.PoolSize, o, rep)
		env.close()
		if err != nil {
			return err
		}
		p50s[mode] = p50
	}
	if off, ok := p50s["off"]; ok {
		for _, m := range []string{"started", "restored"} {
			if v, ok := p50s[m]; ok && off > 0 {
				rep.row(fmt.Sprintf("fork → first answer p50, %s / off", m), fmt.Sprintf("%.2f", v/off), vals{"ratio": v / off})
			}
		}
	}
	return c.write(rep)
}

// selfCPU is the CPU this process (the engine, in-process) has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// vmmCPU is the CPU a process has used so far (0 if it is gone).
func vmmCPU(pid int) time.Duration {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.CPU()
}

// firstMode measures one pooling mode with env's engine, pooling pool
// VMMs, adding its rows to rep; it returns the fork → first answer p50.
func firstMode(ctx context.Context, env *runEnv, snap *snapshot.Snapshot, mode string, pool int, o FirstAnswerOptions, rep *report) (firstP50 float64, err error) {
	e := env.e
	row := func(measure, value string, v vals) { rep.row(mode+": "+measure, value, v) }
	ask := func(id string) (time.Duration, error) {
		a, err := e.Agent(id)
		if err != nil {
			return 0, err
		}
		t := time.Now()
		res, err := a.RunCode(ctx, agentapi.RunCodeRequest{Code: o.Code})
		if err == nil && res.Error != nil {
			err = fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
		}
		return time.Since(t), err
	}

	// K sequential children, the pool full before each.
	var forks, readies, firsts, seconds, totals, cpuBefore, cpuFirst []float64
	var prepares, restores, hellos, handOuts []float64
	rehearsed := 0
	for i := 0; i < o.Sequential; i++ {
		env.waitPool(snap.ID, pool, o.PoolWait)
		t0 := time.Now()
		sbs, err := e.Fork(ctx, snap.Tag, 1)
		if err != nil {
			return 0, err
		}
		fork := time.Since(t0)
		s := sbs[0]
		c0 := vmmCPU(s.PID())
		first, err := ask(s.ID)
		if err != nil {
			return 0, fmt.Errorf("first request: %w", err)
		}
		total := time.Since(t0)
		c1 := vmmCPU(s.PID())
		second, err := ask(s.ID)
		if err != nil {
			return 0, fmt.Errorf("second request: %w", err)
		}
		if s.Rehearsed {
			rehearsed++
		}
		e.Kill(ctx, []string{s.ID})
		ph := s.Phases
		prepares, restores = append(prepares, ph.PrepareMillis), append(restores, ph.RestoreMillis)
		hellos, handOuts = append(hellos, ph.HelloMillis), append(handOuts, ph.HandOutMillis)
		forks, readies = append(forks, millis(fork)), append(readies, s.ReadyMillis)
		firsts, seconds, totals = append(firsts, millis(first)), append(seconds, millis(second)), append(totals, millis(total))
		cpuBefore, cpuFirst = append(cpuBefore, millis(c0)), append(cpuFirst, millis(c1-c0))
		env.say("%s %d: fork %.0f ms (ready %.0f), first %.0f ms, second %.0f ms; VMM CPU %.0f ms before the fork returned, %.0f ms to the first answer",
			mode, i+1, millis(fork), s.ReadyMillis, millis(first), millis(second), millis(c0), millis(c1-c0))
	}
	p := func(xs []float64) float64 { return percentile(xs, 0.5) }
	firstP50 = p(totals)
	row(fmt.Sprintf("fork → first answer, %d sequential, p50 / p90", o.Sequential),
		fmt.Sprintf("%.0f ms / %.0f ms", firstP50, percentile(totals, 0.9)), vals{"p50_ms": firstP50, "p90_ms": percentile(totals, 0.9)})
	row("phases p50: fork call (agent ready) / first answer / second answer",
		fmt.Sprintf("%.0f (%.0f) / %.0f / %.0f ms", p(forks), p(readies), p(firsts), p(seconds)),
		vals{"fork_ms": p(forks), "ready_ms": p(readies), "first_ms": p(firsts), "second_ms": p(seconds)})
	row("agent ready p50, split: VMM start / restore / hello / hand-out of a child restored ahead",
		fmt.Sprintf("%.0f / %.0f / %.0f / %.0f ms", p(prepares), p(restores), p(hellos), p(handOuts)),
		vals{"prepare_ms": p(prepares), "restore_ms": p(restores), "hello_ms": p(hellos), "handout_ms": p(handOuts)})
	row("VMM CPU p50: up to the fork's return (pool, restore, hand-out) / from there to the first answer",
		fmt.Sprintf("%.0f ms / %.0f ms", p(cpuBefore), p(cpuFirst)), vals{"before_ms": p(cpuBefore), "first_ms": p(cpuFirst)})
	if mode == "restored" {
		row("children rehearsed in the pool", fmt.Sprintf("%d of %d", rehearsed, o.Sequential), vals{"n": float64(rehearsed)})
	}

	// What a waiting pooled VMM burns.
	if pool > 0 {
		env.waitPool(snap.ID, pool, o.PoolWait)
		pids := e.PoolPIDs(snap.ID)
		before := make([]time.Duration, len(pids))
		for i, pid := range pids {
			before[i] = vmmCPU(pid)
		}
		const idle = 10 * time.Second
		time.Sleep(idle)
		var used time.Duration
		for i, pid := range pids {
			used += vmmCPU(pid) - before[i]
		}
		if len(pids) > 0 {
			per := used.Seconds() / idle.Seconds() / float64(len(pids)) * 100
			row("CPU of a waiting pooled VMM", fmt.Sprintf("%.1f %% of a core", per), vals{"percent": per})
		}
	}

	// N at once.
	env.waitPool(snap.ID, pool, o.PoolWait)
	n := o.Concurrent
	fo, err := fanOutAsk(ctx, e, snap.Tag, n, ask)
	if err != nil {
		return 0, err
	}
	sbs, wall, cpuSum, engineCPU := fo.sbs, fo.wall, fo.vmmCPU, fo.engineCPU
	running := fo.ids()
	defer func() { e.Kill(ctx, running) }()
	row(fmt.Sprintf("N=%d forked at once, wall clock until all answered", n), fmt.Sprintf("%.2f s", wall.Seconds()), vals{"n": float64(n), "wall_s": wall.Seconds()})
	perChild := cpuSum.Seconds() / float64(n)
	enginePer := engineCPU.Seconds() / float64(n)
	row("CPU-seconds per child, start to first answer (N at once): its VMM + the engine's share = total",
		fmt.Sprintf("%.2f + %.2f = %.2f s", perChild, enginePer, perChild+enginePer),
		vals{"vmm_cpu_s": perChild, "engine_cpu_s": enginePer, "cpu_s": perChild + enginePer})
	var psss []float64
	for _, s := range sbs {
		if pss, _, err := smapsRollup(s.PID()); err == nil {
			psss = append(psss, float64(pss)/1024)
		}
	}
	row(fmt.Sprintf("per-child PSS, %d running (median)", len(psss)), fmt.Sprintf("%.1f MB", percentile(psss, 0.5)), vals{"pss_mb": percentile(psss, 0.5)})
	seen := map[string]bool{}
	for _, s := range sbs {
		a, err := e.Agent(s.ID)
		if err != nil {
			return 0, err
		}
		res, err := a.RunCode(ctx, agentapi.RunCodeRequest{Code: "import random; random.random()"})
		if err != nil {
			return 0, err
		}
		seen[res.Result["text/plain"]] = true
	}
	row("children with distinct random.random()", fmt.Sprintf("%d of %d", len(seen), n), vals{"distinct": float64(len(seen))})
	e.Kill(ctx, running)
	running = nil

	// The same fan-out again: the first grew the pool toward N
	// (--pool-max), so this one finds its children restored ahead.
	if target := e.PoolTarget(snap.ID); pool > 0 && target > pool {
		env.waitPool(snap.ID, target, o.PoolWait)
		ready := e.PoolSize(snap.ID)
		again, err := fanOutAsk(ctx, e, snap.Tag, n, ask)
		if err != nil {
			return 0, err
		}
		e.Kill(ctx, again.ids())
		row(fmt.Sprintf("N=%d at once again, the pool grown to %d by the first (%d ready), wall clock until all answered", n, target, ready),
			fmt.Sprintf("%.2f s", again.wall.Seconds()), vals{"n": float64(n), "pool": float64(ready), "wall_s": again.wall.Seconds()})
	}
	return firstP50, nil
}

// fanOut is one fork of N children, each asked its first request at once.
type fanOut struct {
	sbs       []*sandbox.Sandbox
	wall      time.Duration // fork until every child answered
	vmmCPU    time.Duration // the children's VMMs, summed, at their answers
	engineCPU time.Duration // this process meanwhile
}

func (f *fanOut) ids() []string { return sandboxIDs(f.sbs) }

// fanOutAsk forks n children of tag and asks each its first request at
// once. On an error the children are killed.
func fanOutAsk(ctx context.Context, e *sandbox.Engine, tag string, n int, ask func(id string) (time.Duration, error)) (*fanOut, error) {
	self0 := selfCPU()
	t0 := time.Now()
	sbs, err := e.Fork(ctx, tag, n)
	if err != nil {
		return nil, err
	}
	fo := &fanOut{sbs: sbs}
	cpu := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = ask(s.ID)
			cpu[i] = vmmCPU(s.PID())
		}()
	}
	wg.Wait()
	fo.wall, fo.engineCPU = time.Since(t0), selfCPU()-self0
	if err := errors.Join(errs...); err != nil {
		e.Kill(ctx, fo.ids())
		return nil, fmt.Errorf("N=%d: %w", n, err)
	}
	for _, c := range cpu {
		fo.vmmCPU += c
	}
	return fo, nil
}
