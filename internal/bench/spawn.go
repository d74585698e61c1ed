package bench

// forkd bench spawn: cold boot against fork-to-ready, concurrent forks,
// per-child memory and, for a snapshot with a Python session, the first
// run_code in a fresh child.

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// SpawnOptions are bench spawn's flags.
type SpawnOptions struct {
	// Tag is the snapshot forked, created from Recipe if missing.
	Tag, Recipe string
	// Sequential forks for p50/p90.
	Sequential int
	// Concurrent is the comma-separated N of concurrent forks ("10,50").
	Concurrent string
	// Cold boots (median reported).
	Cold int
	// MemChildren run while memory is measured (0: not measured).
	MemChildren int
}

// parseConcurrent reads --concurrent: numbers of 1 or more; empty
// entries are skipped.
func parseConcurrent(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--concurrent %q: want numbers like 10,50: %w", s, errdefs.ErrInvalidArgument)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// Spawn runs bench spawn: in one run, cold boots of the snapshot's image;
// fork-to-ready over sequential forks; the wall clock until all N
// children answer for each concurrent N; per-child PSS and private memory
// against a cold-booted VM; and, for a snapshot with a Python session, the
// first run_code in a fresh child against a cold `import pandas`.
func Spawn(ctx context.Context, c Config, o SpawnOptions) error {
	ns, err := parseConcurrent(o.Concurrent)
	if err != nil {
		return err
	}
	env, err := newEnv(c, "spawn", nil)
	if err != nil {
		return err
	}
	defer env.close()
	e, say := env.e, env.say

	snap, err := env.ensureSnapshot(ctx, o.Tag, o.Recipe)
	if err != nil {
		return err
	}
	rep := newReport(ctx, e, "spawn", string(snap.VMM.Accel))
	rep.Setup = fmt.Sprintf("snapshot `%s` (recipe %s, %d MiB, %d vCPU); pool %d; network %s", snap.Tag, snap.Image.Recipe, snap.MemoryMiB, snap.VCPUs, c.PoolSize, c.Network)
	row := rep.row

	// Cold boots.
	var colds []float64
	var coldPSS, coldPriv int64
	for i := 0; i < o.Cold; i++ {
		cv, err := e.ColdBoot(ctx, o.Tag)
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
	row("cold boot to agent answering (median of "+strconv.Itoa(o.Cold)+")", fmt.Sprintf("%.0f ms", coldP50), vals{"p50_ms": coldP50})

	// Sequential forks. ReadyMillis ends when the agent answers; the fork
	// call returns later, after the sandbox is recorded (fsynced) in the
	// state store, as an API answer does.
	var readies, calls, links []float64
	for i := 0; i < o.Sequential; i++ {
		env.waitPool(snap.ID, c.PoolSize, poolWait)
		start := time.Now()
		sbs, err := e.Fork(ctx, o.Tag, 1)
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
	row(fmt.Sprintf("fork-to-ready (agent answering), %d sequential forks, p50 / p90", o.Sequential), fmt.Sprintf("%.1f ms / %.1f ms", p50, p90), vals{"p50_ms": p50, "p90_ms": p90})
	row(fmt.Sprintf("fork call returned (agent answering + state record fsynced), %d sequential forks, p50 / p90", o.Sequential), fmt.Sprintf("%.1f ms / %.1f ms", c50, c90), vals{"p50_ms": c50, "p90_ms": c90})
	row("cold boot / fork-to-ready p50", fmt.Sprintf("%.0f×", coldP50/p50), vals{"ratio": coldP50 / p50})
	l50 := percentile(links, 0.5)
	row("network linking on the fork's path, sequential forks, p50 (share of fork-to-ready p50)", fmt.Sprintf("%.2f ms (%.1f %%)", l50, 100*l50/p50), vals{"p50_ms": l50, "percent": 100 * l50 / p50})

	// Concurrent forks.
	for _, n := range ns {
		env.waitPool(snap.ID, c.PoolSize, poolWait)
		start := time.Now()
		sbs, err := e.Fork(ctx, o.Tag, n)
		if err != nil {
			return err
		}
		wall := time.Since(start)
		var link float64
		for _, s := range sbs {
			link += s.Phases.NetworkMillis
		}
		e.Kill(ctx, sandboxIDs(sbs))
		say("N=%d concurrent: all answering after %s", n, wall.Round(time.Millisecond))
		row(fmt.Sprintf("N=%d concurrent forks, wall clock until all answer", n), fmt.Sprintf("%.2f s", wall.Seconds()), vals{"n": float64(n), "wall_s": wall.Seconds()})
		// Linking is kernel work on the forks' path; measured as wall time
		// under the fan-out's contention, it bounds its CPU from above.
		// Its share of the run's CPU is that bound over wall × cores.
		share := 100 * link / (1000 * wall.Seconds() * float64(runtime.NumCPU()))
		row(fmt.Sprintf("N=%d: network linking on the forks' path, summed (at most this share of the run's CPU)", n), fmt.Sprintf("%.0f ms (%.2f %%)", link, share), vals{"n": float64(n), "sum_ms": link, "percent": share})
	}

	// Per-child memory.
	if o.MemChildren > 0 {
		env.waitPool(snap.ID, c.PoolSize, poolWait)
		sbs, err := e.Fork(ctx, o.Tag, o.MemChildren)
		if err != nil {
			return err
		}
		for _, s := range sbs {
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
		e.Kill(ctx, sandboxIDs(sbs))
		mp, mv := percentile(psss, 0.5), percentile(privs, 0.5)
		cp, cv := float64(coldPSS)/1024, float64(coldPriv)/1024
		row("cold-booted VM: PSS / private", fmt.Sprintf("%.1f MB / %.1f MB", cp, cv), vals{"pss_mb": cp, "private_mb": cv})
		row(fmt.Sprintf("per child (median of %d running): PSS / private", len(psss)), fmt.Sprintf("%.1f MB / %.1f MB", mp/1024, mv/1024), vals{"pss_mb": mp / 1024, "private_mb": mv / 1024})
		if coldPSS > 0 {
			row("child PSS / cold VM PSS", fmt.Sprintf("%.0f %%", 100*mp/float64(coldPSS)), vals{"percent": 100 * mp / float64(coldPSS)})
		}
	}

	if snap.Python.Enabled {
		env.waitPool(snap.ID, c.PoolSize, poolWait)
		if err := spawnPython(ctx, e, snap, rep); err != nil {
			return err
		}
	}
	return c.write(rep)
}

// spawnPython measures the first run_code in a fresh child against a cold
// import in the same guest (a snapshot with a Python session).
func spawnPython(ctx context.Context, e *sandbox.Engine, snap *snapshot.Snapshot, rep *report) error {
	const code = `pd.DataFrame({"a":[1,2]}).sum()`
	sbs, err := e.Fork(ctx, snap.Tag, 3)
	if err != nil {
		return err
	}
	a0, _ := e.Agent(sbs[0].ID)
	t := time.Now()
	res, err := a0.RunCode(ctx, agentapi.RunCodeRequest{Code: code})
	first := time.Since(t)
	if err != nil || res.Error != nil {
		return fmt.Errorf("first run_code failed: %v %+v", err, res.Error)
	}
	t = time.Now()
	a0.RunCode(ctx, agentapi.RunCodeRequest{Code: code})
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
	a2.RunCode(ctx, agentapi.RunCodeRequest{Code: code})
	settled := time.Since(t)
	e.Kill(ctx, sandboxIDs(sbs))
	rep.row("first run_code `pd.DataFrame(...).sum()` right after fork returns", fmt.Sprintf("%.0f ms (second call %.0f ms)", millis(first), millis(second)), vals{"first_ms": millis(first), "second_ms": millis(second)})
	rep.row("first run_code in a child 1 s after fork (reseed done)", fmt.Sprintf("%.0f ms", millis(settled)), vals{"ms": millis(settled)})
	rep.row("cold `python3 -c 'import pandas'` in the same guest", fmt.Sprintf("%.0f ms", millis(cold)), vals{"ms": millis(cold)})
	rep.row("cold import / first run_code", fmt.Sprintf("%.1f×", cold.Seconds()/first.Seconds()), vals{"ratio": cold.Seconds() / first.Seconds()})
	rep.row("template creation (boot + warm + save + hash)", fmt.Sprintf("%.1f s", float64(snap.CreateMillis)/1000), vals{"s": float64(snap.CreateMillis) / 1000})
	return nil
}

// sandboxIDs are the IDs of sbs, in order.
func sandboxIDs(sbs []*sandbox.Sandbox) []string {
	ids := make([]string, 0, len(sbs))
	for _, s := range sbs {
		ids = append(ids, s.ID)
	}
	return ids
}
