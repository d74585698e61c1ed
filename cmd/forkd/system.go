package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

func systemCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "system", Short: "Show what the daemon's data takes and prune what is unused"}
	cmd.AddCommand(systemDFCmd(g), systemPruneCmd(g))
	return cmd
}

func systemDFCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "df",
		Short: "Show the disk (and guest memory) images, snapshots, layers, memory images, OCI layers, pools and sandboxes take",
		Long: "Show counts, sizes and reclaimable bytes by kind. Sizes are allocated disk bytes\n" +
			"(memory files are sparse); for pooled VMMs and sandboxes, the guest memory they\n" +
			"commit. RECLAIMABLE is what `forkd system prune --images` would free. OCI layers\n" +
			"are the layer cache of images built with --from: ACTIVE, those an image lists.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			du, err := c.DiskUsage(cmd.Context())
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(du)
			}
			printDiskUsage(os.Stdout, du)
			return nil
		},
	}
}

// printDiskUsage writes du as a table, a row per kind.
func printDiskUsage(w io.Writer, du apiv1.DiskUsage) {
	tw := tableTo(w, "TYPE\tTOTAL\tACTIVE\tSIZE\tRECLAIMABLE")
	for _, row := range []struct {
		name string
		u    apiv1.Usage
	}{
		{"Images", du.Images}, {"Snapshots", du.Snapshots}, {"Layers", du.Layers},
		{"Memory images", du.MemoryImages}, {"OCI layers (cache)", du.OCILayers},
		{"Pooled VMMs (memory)", du.Pools}, {"Sandboxes (memory)", du.Sandboxes},
	} {
		reclaim := human(row.u.ReclaimableBytes)
		if row.u.SizeBytes > 0 && row.u.ReclaimableBytes > 0 {
			reclaim += fmt.Sprintf(" (%d%%)", row.u.ReclaimableBytes*100/row.u.SizeBytes)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", row.name, row.u.Count, row.u.Active, human(row.u.SizeBytes), reclaim)
	}
	tw.Flush()
}

func systemPruneCmd(g *globals) *cobra.Command {
	var req apiv1.PruneRequest
	var force bool
	cmd := &cobra.Command{
		Use:   "prune [--images] [--dry-run] [--force]",
		Short: "Forget dead sandboxes, remove memory images and OCI layers nothing needs (--images: unused images too)",
		Long: "Forget dead sandboxes, remove assembled memory images whose snapshot is gone, the\n" +
			"cached OCI layers (of images built with --from) no image lists and, with --images,\n" +
			"the images no snapshot was taken from (and then their layers). Snapshots are never\n" +
			"removed (forkd rmi does that). It prints what it would remove and, on a terminal,\n" +
			"asks before removing it unless --force. While an image build is pulling layers, a\n" +
			"prune that would remove layers is refused; retry when it ends.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			plan, err := c.Prune(cmd.Context(), apiv1.PruneRequest{Images: req.Images, DryRun: true})
			if err != nil {
				return err
			}
			if req.DryRun || prunesNothing(plan) {
				if g.jsonOut {
					return printJSON(plan)
				}
				printPrune(os.Stdout, plan)
				return nil
			}
			if !force && !g.jsonOut && isTerminal(os.Stdin) && isTerminal(os.Stderr) {
				printPrune(os.Stderr, plan)
				if !confirm(os.Stdin, os.Stderr, "Remove them?") {
					fmt.Fprintln(os.Stderr, "nothing removed")
					return nil
				}
			}
			res, err := c.Prune(cmd.Context(), apiv1.PruneRequest{Images: req.Images})
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(res)
			}
			printPrune(os.Stdout, res)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&req.Images, "images", false, "also remove the images no snapshot was taken from")
	f.BoolVar(&req.DryRun, "dry-run", false, "print what would be removed; remove nothing")
	f.BoolVarP(&force, "force", "f", false, "do not ask for confirmation")
	return cmd
}

func prunesNothing(r apiv1.PruneResponse) bool {
	return len(r.Sandboxes)+len(r.Images)+len(r.MemoryImages)+len(r.OCILayers) == 0
}

// printPrune says what a prune removed, or with DryRun would remove.
func printPrune(w io.Writer, r apiv1.PruneResponse) {
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "left for another prune: %s\n", s)
	}
	if prunesNothing(r) {
		fmt.Fprintln(w, "nothing to prune")
		return
	}
	verb := "removed"
	if r.DryRun {
		verb = "would remove"
	}
	for _, id := range r.Sandboxes {
		fmt.Fprintf(w, "%s dead sandbox %s\n", verb, id)
	}
	for _, img := range r.Images {
		fmt.Fprintf(w, "%s image %s (recipe %s, %s)\n", verb, shortDigest(img.Digest), img.Recipe, human(img.SizeBytes))
	}
	for _, d := range r.MemoryImages {
		fmt.Fprintf(w, "%s memory image %s\n", verb, shortDigest(strings.TrimPrefix(d, "sha256:")))
	}
	for _, d := range r.OCILayers {
		fmt.Fprintf(w, "%s OCI layer %s\n", verb, shortDigest(strings.TrimPrefix(d, "sha256:")))
	}
	if r.DryRun {
		fmt.Fprintf(w, "would free %s\n", human(r.ReclaimedBytes))
	} else {
		fmt.Fprintf(w, "freed %s\n", human(r.ReclaimedBytes))
	}
}

// confirm asks question on w and reads a yes from r.
func confirm(r io.Reader, w io.Writer, question string) bool {
	fmt.Fprintf(w, "%s [y/N] ", question)
	line, _ := bufio.NewReader(r).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

// shortDigest is a digest as listings print it: its first 12 characters.
func shortDigest(d string) string { return d[:min(12, len(d))] }
