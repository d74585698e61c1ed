package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/progress"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

func table(header string) *tabwriter.Writer { return tableTo(os.Stdout, header) }

// tableTo starts a table with its header on w.
func tableTo(w io.Writer, header string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	return tw
}

// human writes a byte count for people: "512 B", "1.5 GiB".
func human(n int64) string { return progress.HumanBytes(n) }

// recipeFile turns a recipe argument into what the API takes: a name as
// is, or, for a path to a .toml file, its contents (the daemon may be
// remote, and never reads files it is pointed at).
func recipeFile(arg string) (name, toml string, err error) {
	if !strings.ContainsRune(arg, '/') && !strings.HasSuffix(arg, ".toml") {
		return arg, "", nil
	}
	data, err := os.ReadFile(arg)
	if err != nil {
		return "", "", fmt.Errorf("recipe file: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return "", string(data), nil
}

// parseMemory reads "512M", "1G", "512" (MiB).
func parseMemory(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	u := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(s, "iB"), "B"))
	mult := 1
	switch {
	case strings.HasSuffix(u, "G"):
		mult, u = 1024, strings.TrimSuffix(u, "G")
	case strings.HasSuffix(u, "M"):
		u = strings.TrimSuffix(u, "M")
	}
	var n int
	if _, err := fmt.Sscanf(u, "%d", &n); err != nil || n <= 0 || fmt.Sprint(n) != u {
		return 0, fmt.Errorf("memory %q: want a size like 512M or 1G: %w", s, errdefs.ErrInvalidArgument)
	}
	return n * mult, nil
}

func snapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Create, list, inspect and remove snapshots"}
	var req apiv1.CreateSnapshotRequest
	var memory, network, idemKey, recipeArg string
	var of opFlags
	var bf buildFlags
	create := &cobra.Command{
		Use:   "create --tag TAG (--recipe RECIPE | --from REF | -f Dockerfile [CONTEXT])",
		Short: "Build (or find cached) an image, boot it, warm it, and save it as a snapshot tag to fork from",
		Long: "Build (or find cached) the image of a recipe (a name the daemon knows or a local .toml\n" +
			"file, whose files are sent), an OCI image (--from) or a Dockerfile (-f, with CONTEXT),\n" +
			"as forkd image build does; boot it, run its warm-up, and save it as TAG.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := snapshot.ValidateNewTag(req.Tag); err != nil {
				return err
			}
			mem, err := parseMemory(memory)
			if err != nil {
				return err
			}
			req.MemoryMiB = mem
			if req.Network, err = policyFlag(network); err != nil {
				return err
			}
			if err := bf.fill(cmd.Context(), &req.BuildSource, recipeArg, args); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			// The daemon owns the work: Ctrl-C detaches, the snapshot is
			// still created (`forkd operation cancel` cancels it).
			op, err := c.StartCreateSnapshot(cmd.Context(), req, idemKey)
			if err != nil {
				return err
			}
			var snap apiv1.Snapshot
			if done, err := printedOr(followOperation(cmd.Context(), g, c, op, of.detach, &snap)); done {
				return err
			}
			fmt.Printf("snapshot %s created in %.1fs (recipe %s, %d MiB, %d vCPU, %s on disk)\n", snap.Tag, float64(snap.CreateMillis)/1000, snap.Recipe, snap.MemoryMiB, snap.VCPUs, human(snap.DiskBytes))
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&req.Tag, "tag", "", "tag to create ("+snapshot.TagRule+")")
	f.StringVar(&recipeArg, "recipe", "", "recipe name (recipes/NAME.toml on the daemon) or a local .toml file (its files are sent)")
	f.StringVar(&req.Warm, "warm", "", "Python code run in the session before the snapshot (replaces the recipe's)")
	f.StringVar(&memory, "memory", "", "guest memory, e.g. 512M (default: the recipe's)")
	f.IntVar(&req.VCPUs, "vcpus", 0, "vCPUs (default: the recipe's)")
	f.StringVar(&network, "network", "", "egress policy its children inherit unless their fork names one (default: the daemon's --network): "+policyHelp)
	f.StringVar(&idemKey, "idempotency-key", "", "a retry with the same key (and flags) follows the first create instead of starting another")
	of.bind(create)
	bf.bind(f, &req.BuildSource)
	create.MarkFlagRequired("tag")

	info := &cobra.Command{
		Use: "info TAG", Short: "Show a snapshot's manifest: files, sizes, digests", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := snapshot.ValidateTag(args[0]); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			s, err := c.Snapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(s)
			}
			if s.ID == "" { // a background branch: only its tag and state exist so far
				fmt.Printf("tag:        %s\nstate:      %s (branch started %s)\n", s.Tag, s.State, s.Created.Local().Format(time.DateTime))
				if s.Error != "" {
					fmt.Printf("error:      %s\n", s.Error)
				}
				return nil
			}
			fmt.Printf("tag:        %s (id %s)\nstate:      %s\ncreated:    %s in %.1fs\nrecipe:     %s (image %s)\nvmm:        %s %s (%s)\nshape:      %d MiB, %d vCPU, python session: %v\nsize:       %s logical, %s on disk (physical)\npooled:     %d VMMs ready\n",
				s.Tag, s.ID, s.State, s.Created.Local().Format(time.DateTime), float64(s.CreateMillis)/1000, s.Recipe, s.ImageDigest[:min(12, len(s.ImageDigest))], s.VMM, s.VMMVersion, s.Accel, s.MemoryMiB, s.VCPUs, s.Python, human(s.SizeBytes), human(s.DiskBytes), s.Pooled)
			if s.Error != "" {
				fmt.Printf("error:      %s\n", s.Error)
			}
			fmt.Printf("depth:      %d", s.Depth)
			if s.Depth == 0 {
				fmt.Printf(" (self-contained)")
			}
			fmt.Println()
			if s.Parent != nil {
				fmt.Printf("parent:     %s (%s)\n", s.Parent.Tag, s.Parent.Digest)
			}
			if len(s.Ancestors) > 0 {
				fmt.Printf("ancestors:  %s\n", strings.Join(s.Ancestors, " <- "))
			}
			if len(s.Dependents) > 0 {
				fmt.Printf("dependents: %s\n", strings.Join(s.Dependents, ", "))
			}
			if s.Owner != "" {
				fmt.Printf("owner:      tenant %s\n", s.Owner)
			}
			if len(s.SharedWith) > 0 {
				fmt.Printf("shared:     read-only with %s\n", sharedList(s.SharedWith))
			}
			fmt.Println("files:")
			for name, f := range s.Files {
				fmt.Printf("  %-10s %10s  sha256:%s\n", name, human(f.Size), f.SHA256)
			}
			return nil
		},
	}
	ls := snapshotsCmd(g)
	ls.Use, ls.Aliases = "ls", []string{"list"}
	rm := rmiCmd(g)
	rm.Use, rm.Aliases = "rm TAG...", []string{"delete", "remove"}

	var from, to string
	var compactOf opFlags
	compact := &cobra.Command{
		Use:   "compact --from HEAD --to FLAT",
		Short: "Write a self-contained copy of a chain head (no parent) under a new tag",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := snapshot.ValidateTag(from); err != nil {
				return err
			}
			if err := snapshot.ValidateNewTag(to); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			op, err := c.StartCompact(cmd.Context(), from, to)
			if err != nil {
				return err
			}
			var snap apiv1.Snapshot
			if done, err := printedOr(followOperation(cmd.Context(), g, c, op, compactOf.detach, &snap)); done {
				return err
			}
			fmt.Printf("snapshot %s: a flat copy of %s (%s logical, %s on disk) in %.1fs\n", snap.Tag, from, human(snap.SizeBytes), human(snap.DiskBytes), float64(snap.CreateMillis)/1000)
			return nil
		},
	}
	compact.Flags().StringVar(&from, "from", "", "the chain head to copy")
	compact.Flags().StringVar(&to, "to", "", "tag of the flat copy")
	compactOf.bind(compact)
	compact.MarkFlagRequired("from")
	compact.MarkFlagRequired("to")
	cmd.AddCommand(create, info, ls, rm, compact)
	cmd.AddCommand(snapshotShareCmds(g)...)
	return cmd
}

func snapshotsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "snapshots", Short: "List snapshot tags", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			snaps, err := c.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(snaps)
			}
			tw := table("TAG\tSTATE\tPARENT\tRECIPE\tMEMORY\tVCPUS\tPYTHON\tON DISK\tPOOLED\tCREATED")
			for _, s := range snaps {
				parent := "-"
				if s.Parent != nil {
					parent = fmt.Sprintf("%s (depth %d)", s.Parent.Tag, s.Depth)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d MiB\t%d\t%v\t%s\t%d\t%s\n", s.Tag, s.State, parent, s.Recipe, s.MemoryMiB, s.VCPUs, s.Python, human(s.DiskBytes), s.Pooled, s.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

func rmiCmd(g *globals) *cobra.Command {
	var cascade, force bool
	cmd := &cobra.Command{
		Use: "rmi TAG...", Short: "Remove snapshot tags (running children keep running)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, t := range args {
				if err := snapshot.ValidateTag(t); err != nil {
					return err
				}
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			var all []string
			for _, t := range args {
				removed, err := c.RemoveSnapshotWith(cmd.Context(), t, cascade, force)
				if err != nil {
					return err
				}
				all = append(all, removed...)
				if !g.jsonOut {
					for _, r := range removed {
						fmt.Println("removed", r)
					}
				}
			}
			if g.jsonOut {
				return printJSON(map[string]any{"removed": all})
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&cascade, "cascade", false, "also remove the diff layers built on the tag")
	cmd.Flags().BoolVar(&force, "force", false, "remove the tag even though layers need it (they stop working)")
	return cmd
}

func forkCmd(g *globals) *cobra.Command {
	var tag string
	var n int
	var quiet bool
	var timeout, idle time.Duration
	var labels []string
	var network string
	var limits limitFlags
	var cpus float64
	var idemKey, pullPolicy string
	cmd := &cobra.Command{
		Use:   "fork --tag TAG|REF [-n N]",
		Short: "Fork N sandboxes from a snapshot (a local tag, or a registry reference pulled on first use); returns when every agent answers (they keep running)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := apiv1.ForkRequest{Tag: tag}
			if err := forkSource(cmd.Context(), &req, pullPolicy); err != nil {
				return err
			}
			if n < 1 {
				return fmt.Errorf("-n %d: fork at least 1 sandbox: %w", n, errdefs.ErrInvalidArgument)
			}
			meta, err := parseLabels(labels)
			if err != nil {
				return err
			}
			pol, err := policyFlag(network)
			if err != nil {
				return err
			}
			if err := limits.apply(pol); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			req.Count, req.Metadata, req.Network, req.CPUs = n, meta, pol, cpus
			req.TimeoutSeconds, req.IdleTimeoutSeconds = lifetimeFlag(cmd, "timeout", timeout), wholeSeconds(idle)
			resp, err := c.ForkIdempotent(cmd.Context(), req, idemKey)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(resp)
			}
			if quiet {
				for _, s := range resp.Sandboxes {
					fmt.Println(s.ID)
				}
				return nil
			}
			tw := table("SANDBOX\tREADY\tPOOLED\tPID")
			for _, s := range resp.Sandboxes {
				fmt.Fprintf(tw, "%s\t%.1f ms\t%v\t%d\n", s.ID, s.ReadyMillis, s.Pooled, s.PID)
			}
			tw.Flush()
			fmt.Fprintf(os.Stderr, "%d sandbox(es) from %s, all answering after %.1f ms\n", len(resp.Sandboxes), tag, resp.TotalMillis)
			return nil
		},
	}
	cmd.Flags().StringVar(&tag, "tag", "", "snapshot tag to fork from, or a registry reference HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST) that `forkd push` wrote, which the daemon pulls for your tenant on first use")
	cmd.Flags().StringVar(&pullPolicy, "pull-policy", "", pullPolicyHelp)
	cmd.Flags().IntVarP(&n, "count", "n", 1, "number of sandboxes")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the sandbox ids")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "end each sandbox this long after creation (e.g. 30m; 0: never; default: the daemon's --sandbox-timeout, 1h unless set); change it later with `forkd sandbox timeout`")
	cmd.Flags().DurationVar(&idle, "idle-timeout", 0, "end a sandbox after this long without requests (0: never)")
	cmd.Flags().Float64Var(&cpus, "cpus", 0, "CPU limit of each sandbox, e.g. 0.5 (from 0.1 to the snapshot's vCPUs; default: one CPU per vCPU plus half a CPU for its VMM)")
	cmd.Flags().StringVar(&idemKey, "idempotency-key", "", "a retry with the same key (and flags) gets the first fork's sandboxes instead of new ones")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "metadata label key=value (repeatable)")
	cmd.Flags().StringVar(&network, "network", "", "egress policy of the new sandboxes (default: the snapshot's, else the daemon's --network): "+policyHelp)
	addLimitFlags(cmd.Flags(), &limits)
	cmd.MarkFlagRequired("tag")
	return cmd
}

// lifetimeFlag is a duration flag as the API's seconds: nil when not
// given (the daemon's default applies), else whole seconds, rounded up so
// that 500ms is not "never".
func lifetimeFlag(cmd *cobra.Command, name string, d time.Duration) *int64 {
	if !cmd.Flags().Changed(name) {
		return nil
	}
	s := wholeSeconds(d)
	return &s
}

// wholeSeconds is d in seconds, a part of one counting as one.
func wholeSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// parseLabels reads repeated key=value flags.
func parseLabels(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value: %w", kv, errdefs.ErrInvalidArgument)
		}
		out[k] = v
	}
	return out, nil
}

func lsCmd(g *globals) *cobra.Command {
	var tag, state string
	var labels []string
	cmd := &cobra.Command{
		Use: "ls", Short: "List sandboxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			sbs, err := c.Sandboxes(cmd.Context(), tag, state, labels...)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(sbs)
			}
			tw := table("SANDBOX\tTAG\tSTATE\tREADY\tPID\tCREATED")
			for _, s := range sbs {
				st := s.State
				if s.DeadReason != "" {
					// One line per sandbox: the whole reason (an exit
					// status and a QEMU error, say) is in `sandbox info`.
					st += ": " + firstLine(vmm.EscapeConsole(s.DeadReason))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f ms\t%d\t%s\n", s.ID, s.Tag, st, s.ReadyMillis, s.PID, s.Created.Local().Format(time.TimeOnly))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&tag, "tag", "", "only sandboxes of this snapshot tag")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (running, dead)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with this label key=value (repeatable)")
	return cmd
}

func killCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use: "kill ID... | --all", Short: "Stop sandboxes", Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return fmt.Errorf("give sandbox ids or --all: %w", errdefs.ErrInvalidArgument)
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			killed, err := c.Kill(cmd.Context(), args, all)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(map[string]any{"killed": killed})
			}
			for _, id := range killed {
				fmt.Println("killed", id)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "stop every sandbox")
	return cmd
}

// isTerminal reports whether f is a character device (a TTY), where stdin
// should not be forwarded.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func readAllLimited(r io.Reader, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if int64(len(data)) > max {
		return nil, fmt.Errorf("input over %d bytes: %w", max, errdefs.ErrInvalidArgument)
	}
	return data, err
}
