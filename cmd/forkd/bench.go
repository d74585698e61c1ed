package main

// forkd bench: flags and wiring; the benchmarks are internal/bench.

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/forkd-dev/forkd/internal/bench"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

func benchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure forkd on this host"}
	cmd.AddCommand(benchSpawnCmd(g), benchAPICmd(g), benchFirstCmd(g), benchBranchCmd(g), benchChainCmd(g),
		benchImageFromCmd(g), benchWatchdogCmd(g))
	return cmd
}

// benchConfig is what every benchmark gets from the flags: the daemon's
// engine (built with the flags, in the run's own run dir and namespaces,
// its sandboxes stopped when it closes) and this program's watchdog.
func benchConfig(g *globals) (bench.Config, error) {
	self, err := os.Executable()
	if err != nil {
		return bench.Config{}, err
	}
	return bench.Config{
		RunDir: g.runDir, DataDir: g.dataDir, Version: version,
		PoolSize: g.poolSize, PoolStartOnly: g.poolStartOnly, Network: g.network.policy,
		NewEngine: func(o bench.EngineOptions) (*sandbox.Engine, error) {
			eg := *g
			eg.maxFork, eg.stopSandboxes = 1000, true
			eg.poolSize, eg.poolStartOnly = o.PoolSize, o.PoolStartOnly
			e, _, err := eg.newEngine(engineDeps{runDir: o.RunDir, netnsPrefix: o.NetNSPrefix, log: o.Log, state: o.State, metrics: o.Metrics})
			return e, err
		},
		Watchdog: []string{self, "--run-dir", g.runDir, "--data-dir", g.dataDir, "bench", "watchdog", "--owner", strconv.Itoa(os.Getpid())},
		Progress: os.Stderr, Out: os.Stdout, JSON: g.jsonOut,
	}, nil
}

// runBench is a benchmark's RunE: run with the flags' Config.
func runBench(g *globals, run func(context.Context, bench.Config) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		c, err := benchConfig(g)
		if err != nil {
			return err
		}
		return run(cmd.Context(), c)
	}
}

// addBenchEngineFlags adds --pool (help: what it keeps), --pool-max,
// --vmm and --accel to a benchmark that runs an engine.
func addBenchEngineFlags(f *pflag.FlagSet, g *globals, poolHelp string) {
	addPoolFlags(f, g, poolHelp)
	addDriverFlags(f, g, "")
}

// addSnapshotFlags adds --tag and --recipe: the snapshot a benchmark forks.
func addSnapshotFlags(f *pflag.FlagSet, tag, recipe *string, defTag, defRecipe string) {
	f.StringVar(tag, "tag", defTag, "snapshot to fork (created from --recipe if missing)")
	f.StringVar(recipe, "recipe", defRecipe, "recipe for a missing --tag")
}

const benchReportHelp = "Prints a Markdown report (append it to docs/BENCHMARKS.md), or with --json the same rows\n" +
	"with their numbers as one JSON object; progress goes to stderr."

func benchSpawnCmd(g *globals) *cobra.Command {
	var o bench.SpawnOptions
	cmd := &cobra.Command{
		Use:   "spawn",
		Short: "Cold boot vs fork-to-ready, concurrent forks, per-child memory (runs its own engine; needs root)",
		Long: "Runs an engine in-process (its own run dir and namespaces, the shared data dir) and measures,\n" +
			"in one run: cold boot of the snapshot's image; fork-to-ready p50/p90 over sequential forks;\n" +
			"wall clock until all N children answer for each concurrent N; per-child PSS and private\n" +
			"memory (smaps_rollup) against a cold-booted VM; and, for a snapshot with a Python session,\n" +
			"the first run_code in a fresh child against a cold `import pandas` in the same guest.\n" +
			benchReportHelp,
		Args: cobra.NoArgs,
		RunE: runBench(g, func(ctx context.Context, c bench.Config) error { return bench.Spawn(ctx, c, o) }),
	}
	f := cmd.Flags()
	addSnapshotFlags(f, &o.Tag, &o.Recipe, "bench-minimal", "minimal")
	f.IntVar(&o.Sequential, "sequential", 20, "sequential forks for p50/p90")
	f.StringVar(&o.Concurrent, "concurrent", "10,50", "comma-separated N for concurrent forks")
	f.IntVar(&o.Cold, "cold", 3, "cold boots (median reported)")
	f.IntVar(&o.MemChildren, "mem-children", 10, "children running while memory is measured")
	addBenchEngineFlags(f, g, "pre-started VMMs per snapshot")
	addVMMFlags(f, g) // --memory-dir: where clones' memory images live, as a daemon has it
	addNetworkFlags(f, &g.network)
	return cmd
}

func benchAPICmd(g *globals) *cobra.Command {
	var o bench.APIOptions
	cmd := &cobra.Command{
		Use:   "api",
		Short: "API overhead on exec and exec under many concurrent API clients (runs its own engine and API server; needs root)",
		Long: "Runs an engine in-process (its own run dir and namespaces, the shared data dir) behind the\n" +
			"daemon's API stack (api.Server with metrics and an audit log, served on a Unix socket in\n" +
			"its run dir) and measures, in one run:\n" +
			"  - the API's overhead: --calls sequential `exec true` in one sandbox, straight to the\n" +
			"    agent, through the API with the CLI's client (NDJSON stream), and through the API\n" +
			"    with the buffered JSON answer (Accept: application/json), interleaved call by call;\n" +
			"  - exec under load: --clients concurrent API clients looping `exec true` over\n" +
			"    --sandboxes sandboxes for --duration; requests, failures, latency and throughput.\n" +
			benchReportHelp,
		Args: cobra.NoArgs,
		RunE: runBench(g, func(ctx context.Context, c bench.Config) error { return bench.API(ctx, c, o) }),
	}
	f := cmd.Flags()
	addSnapshotFlags(f, &o.Tag, &o.Recipe, "bench-minimal", "minimal")
	f.IntVar(&o.Calls, "calls", 200, "sequential calls per path for the overhead measure")
	f.IntVar(&o.PortCalls, "port-calls", 200, "sequential HTTP GETs per path for the port proxy's overhead (0 skips it)")
	f.IntVar(&o.Clients, "clients", 200, "concurrent API clients in the load measure (0 skips it)")
	f.IntVar(&o.Sandboxes, "sandboxes", 20, "sandboxes the load is spread over")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "how long clients keep issuing requests")
	f.BoolVar(&o.SharedClient, "shared-client", false, "all load clients share one API client (one HTTP transport) instead of one each")
	f.BoolVar(&o.NoAudit, "no-audit", false, "serve without the audit log (the daemon always has one)")
	f.DurationVar(&o.RequestTimeout, "request-timeout", 2*time.Minute, "a load request taking longer fails")
	f.IntVar(&o.ShowErrors, "show-errors", 5, "first errors printed")
	addBenchEngineFlags(f, g, "pre-started VMMs per snapshot")
	return cmd
}

func benchFirstCmd(g *globals) *cobra.Command {
	var o bench.FirstAnswerOptions
	cmd := &cobra.Command{
		Use:   "first-answer",
		Short: "Fork → a child's first run_code answer, per phase and in CPU, with each way of pooling (runs its own engine; needs root)",
		Long: "Runs an engine in-process for each pooling mode in turn (--modes: off, started, restored) and\n" +
			"measures, one run: K sequential children, each forked (pool full) and asked --code twice: the\n" +
			"fork call, the first and second answers, and the CPU its VMM used up to the fork's return (pool\n" +
			"and hand-out included) and from there to the first answer; then N children forked at once, each\n" +
			"asked --code: the wall clock until all answered, CPU-seconds per child (its VMM's, start to first\n" +
			"answer), per-child PSS with the N running, and how many distinct random.random() values they draw.\n" +
			"Also the CPU a pooled VMM burns while it waits. Needs a snapshot with a Python session.",
		Args: cobra.NoArgs,
		RunE: runBench(g, func(ctx context.Context, c bench.Config) error { return bench.FirstAnswer(ctx, c, o) }),
	}
	f := cmd.Flags()
	addSnapshotFlags(f, &o.Tag, &o.Recipe, "bench-py", "py-pandas")
	f.StringVar(&o.Code, "code", `pd.DataFrame({"a":[1,2]}).sum()`, "the first request")
	f.StringVar(&o.Modes, "modes", "off,started,restored", "pooling modes to measure, in this order")
	f.IntVar(&o.Sequential, "sequential", 10, "sequential children (K)")
	f.IntVar(&o.Concurrent, "concurrent", 10, "children forked at once (N)")
	f.DurationVar(&o.PoolWait, "pool-wait", 3*time.Minute, "longest wait for the pool to fill before each fork")
	addBenchEngineFlags(f, g, "pooled VMMs per snapshot in the started and restored modes")
	addVMMFlags(f, g)
	addNetworkFlags(f, &g.network)
	return cmd
}

func benchBranchCmd(g *globals) *cobra.Command {
	var o bench.BranchOptions
	cmd := &cobra.Command{
		Use:   "branch",
		Short: "Branch pause and cost of a sandbox, diff / full / live, for each guest memory size and amount it wrote",
		Long: "For each --memory size: creates a snapshot of the minimal recipe with that much guest memory\n" +
			"(kept as bench-branch-SIZE); for each --dirty-mb, forks one sandbox, has it write that much fresh\n" +
			"data to its tmpfs (0: none), lets it idle, and branches it --rounds times per mode. Reports the\n" +
			"median pause (stop to cont as the caller sees it), total time and bytes written. Prints a\n" +
			"Markdown report (append it to docs/BENCHMARKS.md), or with --json the same rows with their\n" +
			"numbers as one JSON object.",
		Args: cobra.NoArgs,
		RunE: runBench(g, func(ctx context.Context, c bench.Config) error { return bench.Branch(ctx, c, o) }),
	}
	f := cmd.Flags()
	f.StringVar(&o.Memory, "memory", "256,1024", "guest memory sizes in MiB, comma-separated")
	f.IntVar(&o.Rounds, "rounds", 5, "branches per mode and size (median reported)")
	f.StringVar(&o.DirtyMB, "dirty-mb", "0", "MB of fresh data the sandbox writes before it is branched, comma-separated (0: idle; it must fit in the guest's /tmp, about 40 % of its memory)")
	addBenchEngineFlags(f, g, "pre-started VMMs per snapshot")
	addVMMFlags(f, g)
	return cmd
}

func benchChainCmd(g *globals) *cobra.Command {
	var o bench.ChainOptions
	cmd := &cobra.Command{
		Use:   "chain",
		Short: "Fork-to-ready from a chain head of diff layers against a flat snapshot",
		Long: "Creates a flat snapshot (minimal recipe, --memory MiB), then a chain of --depth diff layers,\n" +
			"each a branch of a child of the previous one after it wrote --dirty-mb of fresh memory. Then\n" +
			"compacts the head into a flat snapshot of the same memory, forks alternately from that and\n" +
			"from the head (--forks each, pool as a daemon has it) and reports medians, the ratio, the\n" +
			"first fork from the head (which assembles its memory image once), and the layers' sizes.\n" +
			"Prints a Markdown report, or with --json the same rows with their numbers.",
		Args: cobra.NoArgs,
		RunE: runBench(g, func(ctx context.Context, c bench.Config) error { return bench.Chain(ctx, c, o) }),
	}
	f := cmd.Flags()
	f.IntVar(&o.Depth, "depth", 3, "layers in the chain")
	f.IntVar(&o.DirtyMB, "dirty-mb", 50, "fresh memory each layer's sandbox writes (MB)")
	f.IntVar(&o.Forks, "forks", 10, "forks from each of flat and head")
	f.StringVar(&o.Memory, "memory", "512", "guest memory in MiB")
	addBenchEngineFlags(f, g, "pre-started VMMs per snapshot")
	addVMMFlags(f, g)
	return cmd
}

func benchImageFromCmd(g *globals) *cobra.Command {
	o := bench.ImageFromOptions{AgentBinary: agentBinary}
	cmd := &cobra.Command{
		Use:   "image-from",
		Short: "`image build --from` of a test-made image, cold and rebuilt, against skopeo copy + extraction (needs docker-registry, skopeo, umoci)",
		Long: "Starts Debian's docker-registry on loopback (a unix socket behind a 127.0.0.1 proxy), pushes an image\n" +
			"made here (--size-mb of random, incompressible files in --layers layers), and measures in one run:\n" +
			"forkd's image build --from with an empty layer cache (in-process image builder, the data dir's\n" +
			"kernel), the same build again (a rebuild with nothing changed), a build with the layers cached but\n" +
			"no root file system; then `skopeo copy docker://... oci:DIR` followed by `umoci unpack` and by\n" +
			"`tar -xzf` of each layer, in a directory on the data dir's file system. Everything it made is\n" +
			"removed at the end. scripts/install-deps.sh --bench installs the tools.",
		Args: cobra.NoArgs,
		RunE: runBench(g, func(ctx context.Context, c bench.Config) error { return bench.ImageFrom(ctx, c, o) }),
	}
	f := cmd.Flags()
	f.IntVar(&o.SizeMB, "size-mb", 100, "image content in MB")
	f.IntVar(&o.Layers, "layers", 4, "layers (the content split evenly)")
	f.IntVar(&o.Files, "files", 8, "files per layer")
	return cmd
}

func benchWatchdogCmd(g *globals) *cobra.Command {
	var owner int
	cmd := &cobra.Command{
		Use:    "watchdog --owner PID",
		Short:  "Wait until a bench run has exited, then remove its VMMs, namespaces and files (started by bench itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(*cobra.Command, []string) error { return bench.Watchdog(g.runDir, g.dataDir, owner) },
	}
	cmd.Flags().IntVar(&owner, "owner", 0, "pid of the bench run to clean up after")
	return cmd
}
