package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

func benchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure forkd on this host"}
	var o benchOpts
	spawn := &cobra.Command{
		Use:   "spawn",
		Short: "Cold boot vs fork-to-ready, concurrent forks, per-child memory (runs its own engine; needs root)",
		Long: "Runs an engine in-process (its own run dir and namespaces, the shared data dir) and measures,\n" +
			"in one run: cold boot of the snapshot's image; fork-to-ready p50/p90 over sequential forks;\n" +
			"wall clock until all N children answer for each concurrent N; per-child PSS and private\n" +
			"memory (smaps_rollup) against a cold-booted VM; and, for a snapshot with a Python session,\n" +
			"the first run_code in a fresh child against a cold `import pandas` in the same guest.\n" +
			"Prints a Markdown report (append it to docs/BENCHMARKS.md), or with --json the same rows\n" +
			"with their numbers as one JSON object; progress goes to stderr.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchSpawn(cmd.Context(), g, o) },
	}
	f := spawn.Flags()
	f.StringVar(&o.tag, "tag", "bench-minimal", "snapshot to fork (created from --recipe if missing)")
	f.StringVar(&o.recipe, "recipe", "minimal", "recipe for a missing --tag")
	f.IntVar(&o.sequential, "sequential", 20, "sequential forks for p50/p90")
	f.StringVar(&o.concurrent, "concurrent", "10,50", "comma-separated N for concurrent forks")
	f.IntVar(&o.cold, "cold", 3, "cold boots (median reported)")
	f.IntVar(&o.memChildren, "mem-children", 10, "children running while memory is measured")
	addPoolFlags(f, g, "pre-started VMMs per snapshot")
	addDriverFlags(f, g, "")
	addVMMFlags(f, g) // --memory-dir: where clones' memory images live, as a daemon has it
	addNetworkFlags(f, &g.network)
	cmd.AddCommand(spawn)
	cmd.AddCommand(benchAPICmd(g))
	cmd.AddCommand(benchFirstCmd(g))
	cmd.AddCommand(benchBranchCmds(g)...)
	cmd.AddCommand(benchImageFromCmd(g))
	cmd.AddCommand(benchWatchdogCmd(g))
	return cmd
}

type benchOpts struct {
	tag, recipe, concurrent string
	sequential, cold        int
	memChildren             int
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(p*float64(len(s)-1) + 0.5)
	return s[i]
}

// smapsRollup reads Pss and private memory (kB) of a process. Pages a
// clone copied on hugetlbfs (Private_Hugetlb) are in neither kernel field
// and are added to both; the huge pages it shares with other clones (the
// image) are left out, as a share of them is not reported.
func smapsRollup(pid int) (pss, private int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Pss:":
			pss = v
		case "Private_Clean:", "Private_Dirty:":
			private += v
		case "Private_Hugetlb:":
			pss += v
			private += v
		}
	}
	return pss, private, sc.Err()
}

// waitPool waits (bounded) until the snapshot's pool is full again, so each
// measured fork sees the steady state of a daemon between requests. Full
// is the pool's target, which a fan-out before may have raised past its
// base size: the refill restoring toward it would otherwise run under the
// next measurement.
func waitPool(e *sandbox.Engine, snapID string, size int) {
	waitPoolFull(e, snapID, max(size, e.PoolTarget(snapID)), 2*time.Minute)
}

func runBenchSpawn(ctx context.Context, g *globals, o benchOpts) error {
	var ns []int
	for _, s := range strings.Split(o.concurrent, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("--concurrent %q: want numbers like 10,50: %w", o.concurrent, errdefs.ErrInvalidArgument)
		}
		ns = append(ns, n)
	}
	env, err := newBenchEnv(g, "spawn", nil)
	if err != nil {
		return err
	}
	defer env.close()
	e := env.e
	say := benchSay

	snap, err := benchSnapshot(ctx, e, o.tag, o.recipe, say)
	if err != nil {
		return err
	}
	report := newBenchReport(ctx, e, "spawn", string(snap.VMM.Accel))
	report.Setup = fmt.Sprintf("snapshot `%s` (recipe %s, %d MiB, %d vCPU); pool %d; network %s", snap.Tag, snap.Image.Recipe, snap.MemoryMiB, snap.VCPUs, g.poolSize, g.network.policy)
	row := report.row

	// Cold boots.
	var colds []float64
	var coldPSS, coldPriv int64
	for i := 0; i < o.cold; i++ {
		cv, err := e.ColdBoot(ctx, o.tag)
		if err != nil {
			return err
		}
		colds = append(colds, millis(cv.Ready))
		if i == 0 {
			cv.Agent.Exec(ctx, agentapi.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
			time.Sleep(500 * time.Millisecond)
			coldPSS, coldPriv, _ = smapsRollup(cv.PID)
		}
		cv.Stop()
		say("cold boot %d: %.0f ms", i+1, colds[i])
	}
	coldP50 := percentile(colds, 0.5)
	row("cold boot to agent answering (median of "+strconv.Itoa(o.cold)+")", fmt.Sprintf("%.0f ms", coldP50), vals{"p50_ms": coldP50})

	// Sequential forks. ReadyMillis ends when the agent answers; the fork
	// call returns later, after the sandbox is recorded (fsynced) in the
	// state store, as an API answer does.
	var readies, calls, links []float64
	for i := 0; i < o.sequential; i++ {
		waitPool(e, snap.ID, g.poolSize)
		start := time.Now()
		sbs, err := e.Fork(ctx, o.tag, 1)
		call := time.Since(start)
		if err != nil {
			return err
		}
		readies = append(readies, sbs[0].ReadyMillis)
		links = append(links, sbs[0].Phases.NetworkMillis)
		calls = append(calls, millis(call))
		e.Kill(ctx, []string{sbs[0].ID})
	}
	p50, p90 := percentile(readies, 0.5), percentile(readies, 0.9)
	c50, c90 := percentile(calls, 0.5), percentile(calls, 0.9)
	say("sequential fork-to-ready p50 %.1f ms p90 %.1f ms; fork call returned p50 %.1f ms p90 %.1f ms", p50, p90, c50, c90)
	row(fmt.Sprintf("fork-to-ready (agent answering), %d sequential forks, p50 / p90", o.sequential), fmt.Sprintf("%.1f ms / %.1f ms", p50, p90), vals{"p50_ms": p50, "p90_ms": p90})
	row(fmt.Sprintf("fork call returned (agent answering + state record fsynced), %d sequential forks, p50 / p90", o.sequential), fmt.Sprintf("%.1f ms / %.1f ms", c50, c90), vals{"p50_ms": c50, "p90_ms": c90})
	row("cold boot / fork-to-ready p50", fmt.Sprintf("%.0f×", coldP50/p50), vals{"ratio": coldP50 / p50})
	l50 := percentile(links, 0.5)
	row("network linking on the fork's path, sequential forks, p50 (share of fork-to-ready p50)", fmt.Sprintf("%.2f ms (%.1f %%)", l50, 100*l50/p50), vals{"p50_ms": l50, "percent": 100 * l50 / p50})

	// Concurrent forks.
	for _, n := range ns {
		waitPool(e, snap.ID, g.poolSize)
		start := time.Now()
		sbs, err := e.Fork(ctx, o.tag, n)
		if err != nil {
			return err
		}
		wall := time.Since(start)
		var ids []string
		var link float64
		for _, s := range sbs {
			ids = append(ids, s.ID)
			link += s.Phases.NetworkMillis
		}
		e.Kill(ctx, ids)
		say("N=%d concurrent: all answering after %s", n, wall.Round(time.Millisecond))
		row(fmt.Sprintf("N=%d concurrent forks, wall clock until all answer", n), fmt.Sprintf("%.2f s", wall.Seconds()), vals{"n": float64(n), "wall_s": wall.Seconds()})
		// Linking is kernel work on the forks' path; measured as wall time
		// under the fan-out's contention, it bounds its CPU from above.
		// Its share of the run's CPU is that bound over wall × cores.
		share := 100 * link / (1000 * wall.Seconds() * float64(runtime.NumCPU()))
		row(fmt.Sprintf("N=%d: network linking on the forks' path, summed (at most this share of the run's CPU)", n), fmt.Sprintf("%.0f ms (%.2f %%)", link, share), vals{"n": float64(n), "sum_ms": link, "percent": share})
	}

	// Per-child memory.
	if o.memChildren > 0 {
		waitPool(e, snap.ID, g.poolSize)
		sbs, err := e.Fork(ctx, o.tag, o.memChildren)
		if err != nil {
			return err
		}
		var ids []string
		for _, s := range sbs {
			ids = append(ids, s.ID)
			if a, err := e.Agent(s.ID); err == nil {
				a.Exec(ctx, agentapi.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
			}
		}
		time.Sleep(500 * time.Millisecond)
		var psss, privs []float64
		for _, s := range sbs {
			pss, priv, err := smapsRollup(s.PID())
			if err == nil {
				psss = append(psss, float64(pss))
				privs = append(privs, float64(priv))
			}
		}
		e.Kill(ctx, ids)
		mp, mv := percentile(psss, 0.5), percentile(privs, 0.5)
		cp, cv := float64(coldPSS)/1024, float64(coldPriv)/1024
		row("cold-booted VM: PSS / private", fmt.Sprintf("%.1f MB / %.1f MB", cp, cv), vals{"pss_mb": cp, "private_mb": cv})
		row(fmt.Sprintf("per child (median of %d running): PSS / private", len(psss)), fmt.Sprintf("%.1f MB / %.1f MB", mp/1024, mv/1024), vals{"pss_mb": mp / 1024, "private_mb": mv / 1024})
		if coldPSS > 0 {
			row("child PSS / cold VM PSS", fmt.Sprintf("%.0f %%", 100*mp/float64(coldPSS)), vals{"percent": 100 * mp / float64(coldPSS)})
		}
	}

	// Python: first run_code in a fresh child vs a cold import in the same guest.
	if snap.Python.Enabled {
		waitPool(e, snap.ID, g.poolSize)
		sbs, err := e.Fork(ctx, o.tag, 3)
		if err != nil {
			return err
		}
		a0, _ := e.Agent(sbs[0].ID)
		t := time.Now()
		res, err := a0.RunCode(ctx, agentapi.RunCodeRequest{Code: `pd.DataFrame({"a":[1,2]}).sum()`})
		first := time.Since(t)
		if err != nil || res.Error != nil {
			return fmt.Errorf("first run_code failed: %v %+v", err, res.Error)
		}
		t = time.Now()
		a0.RunCode(ctx, agentapi.RunCodeRequest{Code: `pd.DataFrame({"a":[1,2]}).sum()`})
		second := time.Since(t)
		a1, _ := e.Agent(sbs[1].ID)
		t = time.Now()
		ev, err := a1.Exec(ctx, agentapi.ExecRequest{Argv: []string{"python3", "-c", "import pandas"}}, nil, io.Discard, io.Discard)
		cold := time.Since(t)
		if err != nil || ev.ExitCode != 0 {
			return fmt.Errorf("cold import failed: %v (exit %d)", err, ev.ExitCode)
		}
		// The same first call in a child that has had a moment after READY
		// (its Python reseed, sent right after READY, has finished).
		time.Sleep(time.Second)
		a2, _ := e.Agent(sbs[2].ID)
		t = time.Now()
		a2.RunCode(ctx, agentapi.RunCodeRequest{Code: `pd.DataFrame({"a":[1,2]}).sum()`})
		settled := time.Since(t)
		e.Kill(ctx, []string{sbs[0].ID, sbs[1].ID, sbs[2].ID})
		row("first run_code `pd.DataFrame(...).sum()` right after fork returns", fmt.Sprintf("%.0f ms (second call %.0f ms)", millis(first), millis(second)), vals{"first_ms": millis(first), "second_ms": millis(second)})
		row("first run_code in a child 1 s after fork (reseed done)", fmt.Sprintf("%.0f ms", millis(settled)), vals{"ms": millis(settled)})
		row("cold `python3 -c 'import pandas'` in the same guest", fmt.Sprintf("%.0f ms", millis(cold)), vals{"ms": millis(cold)})
		row("cold import / first run_code", fmt.Sprintf("%.1f×", cold.Seconds()/first.Seconds()), vals{"ratio": cold.Seconds() / first.Seconds()})
		row("template creation (boot + warm + save + hash)", fmt.Sprintf("%.1f s", float64(snap.CreateMillis)/1000), vals{"s": float64(snap.CreateMillis) / 1000})
	}
	return report.print(g.jsonOut)
}

// benchSnapshot returns the snapshot a benchmark forks, creating it from
// recipe when the tag does not exist yet.
func benchSnapshot(ctx context.Context, e *sandbox.Engine, tag, recipe string, say func(string, ...any)) (*snapshot.Snapshot, error) {
	snap, err := e.Store().Get(tag)
	if errdefs.IsNotFound(err) {
		say("creating snapshot %s from recipe %s", tag, recipe)
		snap, err = e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: tag, Recipe: recipe, Progress: func(m string) { say("  %s", m) }})
	}
	return snap, err
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

func kernelRelease() string {
	data, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(data))
}
