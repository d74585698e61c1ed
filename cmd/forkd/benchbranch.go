package main

// forkd bench branch and forkd bench chain: the targets of BRANCH and of
// diff-snapshot chains, measured in one run on this host with an engine of
// the benchmark's own (like bench spawn).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

type benchBranchOpts struct {
	memories string // comma-separated MiB
	rounds   int
	dirties  string // bench branch: comma-separated MB the sandbox writes first
	dirtyMB  int
	depth    int
	forks    int
}

func benchBranchCmds(g *globals) []*cobra.Command {
	var o, oc benchBranchOpts
	branch := &cobra.Command{
		Use:   "branch",
		Short: "Branch pause and cost of a sandbox, diff / full / live, for each guest memory size and amount it wrote",
		Long: "For each --memory size: creates a snapshot of the minimal recipe with that much guest memory\n" +
			"(kept as bench-branch-SIZE); for each --dirty-mb, forks one sandbox, has it write that much fresh\n" +
			"data to its tmpfs (0: none), lets it idle, and branches it --rounds times per mode. Reports the\n" +
			"median pause (stop to cont as the caller sees it), total time and bytes written. Prints a\n" +
			"Markdown report (append it to docs/BENCHMARKS.md), or with --json the same rows with their\n" +
			"numbers as one JSON object.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchBranch(cmd.Context(), g, o) },
	}
	branch.Flags().StringVar(&o.memories, "memory", "256,1024", "guest memory sizes in MiB, comma-separated")
	branch.Flags().IntVar(&o.rounds, "rounds", 5, "branches per mode and size (median reported)")
	branch.Flags().StringVar(&o.dirties, "dirty-mb", "0", "MB of fresh data the sandbox writes before it is branched, comma-separated (0: idle; it must fit in the guest's /tmp, about 40 % of its memory)")

	chain := &cobra.Command{
		Use:   "chain",
		Short: "Fork-to-ready from a chain head of diff layers against a flat snapshot",
		Long: "Creates a flat snapshot (minimal recipe, --memory MiB), then a chain of --depth diff layers,\n" +
			"each a branch of a child of the previous one after it wrote --dirty-mb of fresh memory. Then\n" +
			"compacts the head into a flat snapshot of the same memory, forks alternately from that and\n" +
			"from the head (--forks each, pool as a daemon has it) and reports medians, the ratio, the\n" +
			"first fork from the head (which assembles its memory image once), and the layers' sizes.\n" +
			"Prints a Markdown report, or with --json the same rows with their numbers.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchChain(cmd.Context(), g, oc) },
	}
	chain.Flags().IntVar(&oc.depth, "depth", 3, "layers in the chain")
	chain.Flags().IntVar(&oc.dirtyMB, "dirty-mb", 50, "fresh memory each layer's sandbox writes (MB)")
	chain.Flags().IntVar(&oc.forks, "forks", 10, "forks from each of flat and head")
	chain.Flags().StringVar(&oc.memories, "memory", "512", "guest memory in MiB")
	for _, c := range []*cobra.Command{branch, chain} {
		addPoolFlags(c.Flags(), g, "pre-started VMMs per snapshot")
		addDriverFlags(c.Flags(), g, "")
		addVMMFlags(c.Flags(), g)
	}
	return []*cobra.Command{branch, chain}
}

func benchSay(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...) }

// sizedSnapshot returns the minimal snapshot with mib of guest memory,
// creating it when missing.
func sizedSnapshot(ctx context.Context, e *sandbox.Engine, tag string, mib int) (*snapshot.Snapshot, error) {
	snap, err := e.Store().Get(tag)
	if errdefs.IsNotFound(err) {
		benchSay("creating snapshot %s (minimal, %d MiB)", tag, mib)
		snap, err = e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: tag, Recipe: "minimal", MemoryMiB: mib})
	}
	return snap, err
}

// memoryDirKind says where clones' memory images live, for the report.
func memoryDirKind(dir string) string {
	if dir == "" {
		return "in the data dir"
	}
	if huge, err := fsutil.HugePageSize(dir); err == nil && huge > 0 {
		return fmt.Sprintf("on hugetlbfs (%d KiB pages)", huge>>10)
	}
	return "on tmpfs"
}

// parseDirties reads --dirty-mb: MB amounts, 0 or more.
func parseDirties(s string) ([]int, error) {
	return parseInts("--dirty-mb", s, 0, "amounts in MB like 0,64")
}

// writeFresh has sandbox id write mb MB of random data to a file in its
// /tmp (a tmpfs: guest memory the sandbox wrote, so pages a branch copies).
func writeFresh(ctx context.Context, e *sandbox.Engine, id, name string, mb int) error {
	a, err := e.Agent(id)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	cmd := fmt.Sprintf("dd if=/dev/urandom of=/tmp/%s bs=1M count=%d 2>&1", name, mb)
	if res, err := a.Exec(ctx, agentapi.ExecRequest{Argv: []string{"sh", "-c", cmd}}, nil, &out, &out); err != nil || res.ExitCode != 0 {
		return fmt.Errorf("sandbox %s: %s: %v %s", id, cmd, err, out.String())
	}
	return nil
}

// parseSizes reads --memory: guest sizes in MiB, 64 or more.
func parseSizes(s string) ([]int, error) {
	return parseInts("--memory", s, 64, "sizes in MiB like 256,1024")
}

// parseInts reads a flag's comma-separated numbers, none below least;
// anything else is an error naming the flag and what it wants.
func parseInts(flag, s string, least int, want string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			return nil, fmt.Errorf("%s %q: want %s: %w", flag, s, want, errdefs.ErrInvalidArgument)
		}
		out = append(out, n)
	}
	return out, nil
}

func runBenchBranch(ctx context.Context, g *globals, o benchBranchOpts) error {
	sizes, err := parseSizes(o.memories)
	if err != nil {
		return err
	}
	dirties, err := parseDirties(o.dirties)
	if err != nil {
		return err
	}
	env, err := newBenchEnv(g, "branch", nil)
	if err != nil {
		return err
	}
	defer env.close()
	e := env.e
	report := newBenchReport(ctx, e, "branch", "")
	report.Intro = fmt.Sprintf("Sandbox of the minimal recipe, idle, after it wrote the fresh data of the \"guest wrote\" column to its tmpfs; %d branches per mode (median); clones' memory %s. "+
		"Pause: diff and full, stop to cont as the caller sees it; live, QEMU's STOP to RESUME events (the guest's own pause).",
		o.rounds, memoryDirKind(e.Config().MemoryDir))
	report.columns = []string{"guest memory", "guest wrote", "mode", "pause p50", "pause max", "total p50", "written p50"}
	for _, mib := range sizes {
		snap, err := sizedSnapshot(ctx, e, fmt.Sprintf("bench-branch-%d", mib), mib)
		if err != nil {
			return err
		}
		for _, dirty := range dirties {
			if err := benchBranchModes(ctx, e, report, snap.Tag, mib, dirty, o.rounds); err != nil {
				return err
			}
		}
	}
	return report.print(g.jsonOut)
}

// benchBranchModes forks a sandbox of tag, has it write dirty MB, and
// branches it rounds times in each mode, adding a row per mode.
func benchBranchModes(ctx context.Context, e *sandbox.Engine, report *benchReport, tag string, mib, dirty, rounds int) error {
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
			pauses = append(pauses, float64(res.Paused.Microseconds())/1000)
			totals = append(totals, float64(res.Duration.Microseconds())/1000)
			written = append(written, float64(res.BytesWritten))
			if _, err := e.RemoveSnapshotWith(ctx, tag, sandbox.RemoveOptions{Cascade: true}); err != nil {
				return err
			}
		}
		measure := fmt.Sprintf("%d MiB, wrote %s, %s", mib, wrote, mode)
		if failure != nil {
			benchSay("%s: %v", measure, failure)
			report.Rows = append(report.Rows, benchRow{Measure: measure, Error: failure.Error(),
				cells: []string{fmt.Sprintf("%d MiB", mib), wrote, mode, "unavailable here: " + oneLine(failure.Error(), 140), "", "", ""}})
			continue
		}
		p50, pmax, t50, w50 := percentile(pauses, 0.5), percentile(pauses, 1), percentile(totals, 0.5), percentile(written, 0.5)
		benchSay("%s: pause p50 %.1f ms, total p50 %.0f ms", measure, p50, t50)
		report.Rows = append(report.Rows, benchRow{
			Measure: measure,
			Value:   fmt.Sprintf("pause p50 %.1f ms, max %.1f ms; total p50 %.0f ms; written p50 %s", p50, pmax, t50, human(int64(w50))),
			Values:  vals{"memory_mib": float64(mib), "dirty_mb": float64(dirty), "pause_p50_ms": p50, "pause_max_ms": pmax, "total_p50_ms": t50, "written_p50_bytes": w50},
			cells: []string{fmt.Sprintf("%d MiB", mib), wrote, mode, fmt.Sprintf("%.1f ms", p50), fmt.Sprintf("%.1f ms", pmax),
				fmt.Sprintf("%.0f ms", t50), human(int64(w50))},
		})
	}
	return nil
}

func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func runBenchChain(ctx context.Context, g *globals, o benchBranchOpts) error {
	sizes, err := parseSizes(o.memories)
	if err != nil || len(sizes) != 1 {
		return fmt.Errorf("--memory: one size in MiB: %w", errdefs.ErrInvalidArgument)
	}
	if o.depth < 1 || o.depth > snapshot.MaxChainDepth {
		return fmt.Errorf("--depth %d: 1 to %d: %w", o.depth, snapshot.MaxChainDepth, errdefs.ErrInvalidArgument)
	}
	env, err := newBenchEnv(g, "chain", nil)
	if err != nil {
		return err
	}
	defer env.close()
	e := env.e
	flat, err := sizedSnapshot(ctx, e, fmt.Sprintf("bench-branch-%d", sizes[0]), sizes[0])
	if err != nil {
		return err
	}
	report := newBenchReport(ctx, e, "chain", "")
	id := snapshot.NewID()
	var tags []string
	defer func() {
		for i := len(tags) - 1; i >= 0; i-- {
			e.RemoveSnapshotWith(context.Background(), tags[i], sandbox.RemoveOptions{Force: true})
		}
	}()
	from := flat.Tag
	var layerRows []benchRow
	for i := 1; i <= o.depth; i++ {
		sbs, err := e.Fork(ctx, from, 1)
		if err != nil {
			return err
		}
		if err := writeFresh(ctx, e, sbs[0].ID, fmt.Sprintf("layer%d", i), o.dirtyMB); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		tag := fmt.Sprintf("bench-chain-%s-l%d", id, i)
		res, err := e.Branch(ctx, sbs[0].ID, sandbox.BranchOptions{Tag: tag})
		if err != nil {
			return err
		}
		tags = append(tags, tag)
		e.Kill(ctx, []string{sbs[0].ID})
		var st syscall.Stat_t
		syscall.Stat(res.Snapshot.Path(snapshot.MemoryFile), &st)
		lr := benchRow{
			Measure: fmt.Sprintf("layer %d", i),
			Value:   fmt.Sprintf("paused %.1f ms, %s written, %s on disk", millis(res.Paused), human(res.BytesWritten), human(st.Blocks*512)),
			Values:  vals{"paused_ms": millis(res.Paused), "written_bytes": float64(res.BytesWritten), "disk_bytes": float64(st.Blocks * 512)},
		}
		layerRows = append(layerRows, lr)
		benchSay("layer %d: %s", i, lr.Value)
		from = tag
	}
	head := from
	// The first fork from the head assembles its memory image.
	start := time.Now()
	sbs, err := e.Fork(ctx, head, 1)
	if err != nil {
		return err
	}
	first := time.Since(start)
	e.Kill(ctx, []string{sbs[0].ID})
	// The fair baseline is a flat snapshot of the same memory: the head
	// compacted (forks from the recipe's base would restore less memory).
	compactTag := fmt.Sprintf("bench-chain-%s-flat", id)
	tc := time.Now()
	flatSnap, err := e.Compact(ctx, head, compactTag)
	if err != nil {
		return err
	}
	compactTook := time.Since(tc)
	tags = append([]string{compactTag}, tags...)
	e.Warm(compactTag)
	headSnap, _ := e.Store().Get(head)
	var flatT, headT []float64
	for i := 0; i < o.forks; i++ {
		for _, s := range []*snapshot.Snapshot{flatSnap, headSnap} {
			waitPool(e, s.ID, g.poolSize)
			sbs, err := e.Fork(ctx, s.Tag, 1)
			if err != nil {
				return err
			}
			if s == flatSnap {
				flatT = append(flatT, sbs[0].ReadyMillis)
			} else {
				headT = append(headT, sbs[0].ReadyMillis)
			}
			e.Kill(ctx, []string{sbs[0].ID})
		}
	}
	f50, h50 := percentile(flatT, 0.5), percentile(headT, 0.5)
	benchSay("fork-to-ready p50: flat %.1f ms, head %.1f ms (%.2f×)", f50, h50, h50/f50)
	report.Intro = fmt.Sprintf("Minimal recipe, %d MiB guest; chain of %d diff layers, each sandbox writing %d MB of fresh memory before its branch; pool %d; %d forks from each, alternating.",
		sizes[0], o.depth, o.dirtyMB, g.poolSize, o.forks)
	report.Rows = append(report.Rows, layerRows...)
	report.row("first fork from the head (assembles its memory once)", fmt.Sprintf("%.0f ms", millis(first)), vals{"ms": millis(first)})
	report.row("compact the head into a flat snapshot", fmt.Sprintf("%.1f s", compactTook.Seconds()), vals{"s": compactTook.Seconds()})
	report.row("fork-to-ready p50, the same memory as a flat snapshot (compacted)", fmt.Sprintf("%.1f ms", f50), vals{"p50_ms": f50})
	report.row(fmt.Sprintf("fork-to-ready p50, head of depth %d", o.depth), fmt.Sprintf("%.1f ms", h50), vals{"p50_ms": h50, "depth": float64(o.depth)})
	report.row("head / flat", fmt.Sprintf("%.2f×", h50/f50), vals{"ratio": h50 / f50})
	return report.print(g.jsonOut)
}
