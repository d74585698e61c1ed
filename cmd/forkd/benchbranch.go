package main

// forkd bench branch and forkd bench chain: the targets of BRANCH and of
// diff-snapshot chains, measured in one run on this host with an engine of
// the benchmark's own (like bench spawn).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

type benchBranchOpts struct {
	memories string // comma-separated MiB
	rounds   int
	dirtyMB  int
	depth    int
	forks    int
}

func benchBranchCmds(g *globals) []*cobra.Command {
	var o, oc benchBranchOpts
	branch := &cobra.Command{
		Use:   "branch",
		Short: "Branch pause and cost of an idle sandbox, diff / full / live, for each guest memory size",
		Long: "For each --memory size: creates a snapshot of the minimal recipe with that much guest memory\n" +
			"(kept as bench-branch-SIZE), forks one sandbox, lets it idle, and branches it --rounds times per\n" +
			"mode. Reports the median pause (stop to cont as the caller sees it), total time and bytes\n" +
			"written. Prints a Markdown report (append it to docs/BENCHMARKS.md).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchBranch(cmd.Context(), g, o) },
	}
	branch.Flags().StringVar(&o.memories, "memory", "256,1024", "guest memory sizes in MiB, comma-separated")
	branch.Flags().IntVar(&o.rounds, "rounds", 5, "branches per mode and size (median reported)")

	chain := &cobra.Command{
		Use:   "chain",
		Short: "Fork-to-ready from a chain head of diff layers against a flat snapshot",
		Long: "Creates a flat snapshot (minimal recipe, --memory MiB), then a chain of --depth diff layers,\n" +
			"each a branch of a child of the previous one after it wrote --dirty-mb of fresh memory. Then\n" +
			"compacts the head into a flat snapshot of the same memory, forks alternately from that and\n" +
			"from the head (--forks each, pool as a daemon has it) and reports medians, the ratio, the\n" +
			"first fork from the head (which assembles its memory image once), and the layers' sizes.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchChain(cmd.Context(), g, oc) },
	}
	chain.Flags().IntVar(&oc.depth, "depth", 3, "layers in the chain")
	chain.Flags().IntVar(&oc.dirtyMB, "dirty-mb", 50, "fresh memory each layer's sandbox writes (MB)")
	chain.Flags().IntVar(&oc.forks, "forks", 10, "forks from each of flat and head")
	chain.Flags().StringVar(&oc.memories, "memory", "512", "guest memory in MiB")
	for _, c := range []*cobra.Command{branch, chain} {
		c.Flags().IntVar(&g.poolSize, "pool", sandbox.DefaultPoolSize, "pre-started VMMs per snapshot")
		c.Flags().StringVar(&g.vmmName, "vmm", envOr("FORKD_VMM", "qemu"), "VMM driver")
		c.Flags().StringVar(&g.accel, "accel", os.Getenv("FORKD_ACCEL"), "accelerator (kvm, tcg, auto)")
		addLiveBranchFlags(c.Flags(), g)
	}
	return []*cobra.Command{branch, chain}
}

// benchEngine starts the benchmark's own engine; stop ends it.
func benchEngine(g *globals, name string) (e *sandbox.Engine, stop func(), err error) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	runDir := filepath.Join(g.runDir, fmt.Sprintf("bench-%s-%d", name, os.Getpid()))
	g.maxFork = 1000
	e, _, err = g.newEngine(engineDeps{runDir: runDir, netnsPrefix: "fkb-", log: log})
	if err != nil {
		return nil, nil, err
	}
	return e, func() { e.Close(context.Background()); os.RemoveAll(runDir) }, nil
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

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 64 {
			return nil, fmt.Errorf("--memory %q: want sizes in MiB like 256,1024: %w", s, errdefs.ErrInvalidArgument)
		}
		out = append(out, n)
	}
	return out, nil
}

func benchHeader(ctx context.Context, e *sandbox.Engine, what string) *bytes.Buffer {
	var b bytes.Buffer
	host, _ := os.Hostname()
	v, _ := e.Driver().Version(ctx)
	fmt.Fprintf(&b, "### forkd bench %s — %s\n\n", what, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Machine: %s, %d CPUs (%s), kernel %s; VMM %s %s.\n\n", host, runtime.NumCPU(), cpuModel(), kernelRelease(), e.Driver().Name(), v)
	return &b
}

func runBenchBranch(ctx context.Context, g *globals, o benchBranchOpts) error {
	sizes, err := parseSizes(o.memories)
	if err != nil {
		return err
	}
	e, stop, err := benchEngine(g, "branch")
	if err != nil {
		return err
	}
	defer stop()
	report := benchHeader(ctx, e, "branch")
	fmt.Fprintf(report, "Idle sandbox of the minimal recipe, %d branches per mode (median); pause = stop to cont as the caller sees it.\n\n", o.rounds)
	fmt.Fprintf(report, "| guest memory | mode | pause p50 | pause max | total p50 | written p50 |\n|---|---|---|---|---|---|\n")
	for _, mib := range sizes {
		snap, err := sizedSnapshot(ctx, e, fmt.Sprintf("bench-branch-%d", mib), mib)
		if err != nil {
			return err
		}
		sbs, err := e.Fork(ctx, snap.Tag, 1)
		if err != nil {
			return err
		}
		src := sbs[0].ID
		time.Sleep(2 * time.Second) // idle: the agent's start-up writes are done
		for _, mode := range []string{sandbox.BranchDiff, sandbox.BranchFull, sandbox.BranchLive} {
			var pauses, totals, written []float64
			var failure error
			for i := 0; i < o.rounds; i++ {
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
			if failure != nil {
				benchSay("%d MiB %s: %v", mib, mode, failure)
				fmt.Fprintf(report, "| %d MiB | %s | unavailable here: %s | | | |\n", mib, mode, oneLine(failure.Error(), 140))
				continue
			}
			benchSay("%d MiB %s: pause p50 %.1f ms, total p50 %.0f ms", mib, mode, percentile(pauses, 0.5), percentile(totals, 0.5))
			fmt.Fprintf(report, "| %d MiB | %s | %.1f ms | %.1f ms | %.0f ms | %s |\n", mib, mode,
				percentile(pauses, 0.5), percentile(pauses, 1), percentile(totals, 0.5), human(int64(percentile(written, 0.5))))
		}
		e.Kill(ctx, []string{src})
	}
	fmt.Println(report.String())
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
	e, stop, err := benchEngine(g, "chain")
	if err != nil {
		return err
	}
	defer stop()
	flat, err := sizedSnapshot(ctx, e, fmt.Sprintf("bench-branch-%d", sizes[0]), sizes[0])
	if err != nil {
		return err
	}
	report := benchHeader(ctx, e, "chain")
	id := snapshot.NewID()
	var tags []string
	defer func() {
		for i := len(tags) - 1; i >= 0; i-- {
			e.RemoveSnapshotWith(context.Background(), tags[i], sandbox.RemoveOptions{Force: true})
		}
	}()
	from := flat.Tag
	var layerRows []string
	for i := 1; i <= o.depth; i++ {
		sbs, err := e.Fork(ctx, from, 1)
		if err != nil {
			return err
		}
		a, err := e.Agent(sbs[0].ID)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		cmd := fmt.Sprintf("dd if=/dev/urandom of=/tmp/layer%d bs=1M count=%d 2>&1", i, o.dirtyMB)
		if res, err := a.Exec(ctx, agentapi.ExecRequest{Argv: []string{"sh", "-c", cmd}}, nil, &out, &out); err != nil || res.ExitCode != 0 {
			return fmt.Errorf("layer %d: %s: %v %s", i, cmd, err, out.String())
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
		layerRows = append(layerRows, fmt.Sprintf("| layer %d | paused %.1f ms, %s written, %s on disk |", i,
			float64(res.Paused.Microseconds())/1000, human(res.BytesWritten), human(st.Blocks*512)))
		benchSay("layer %d: %s", i, layerRows[len(layerRows)-1])
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
	fmt.Fprintf(report, "Minimal recipe, %d MiB guest; chain of %d diff layers, each sandbox writing %d MB of fresh memory before its branch; pool %d; %d forks from each, alternating.\n\n",
		sizes[0], o.depth, o.dirtyMB, g.poolSize, o.forks)
	fmt.Fprintf(report, "| measure | value |\n|---|---|\n")
	for _, r := range layerRows {
		fmt.Fprintln(report, r)
	}
	fmt.Fprintf(report, "| first fork from the head (assembles its memory once) | %.0f ms |\n", float64(first.Microseconds())/1000)
	fmt.Fprintf(report, "| compact the head into a flat snapshot | %.1f s |\n", compactTook.Seconds())
	fmt.Fprintf(report, "| fork-to-ready p50, the same memory as a flat snapshot (compacted) | %.1f ms |\n", f50)
	fmt.Fprintf(report, "| fork-to-ready p50, head of depth %d | %.1f ms |\n", o.depth, h50)
	fmt.Fprintf(report, "| head / flat | %.2f× |\n", h50/f50)
	fmt.Println(report.String())
	return nil
}
