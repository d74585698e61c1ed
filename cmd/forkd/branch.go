package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

func branchCmd(g *globals) *cobra.Command {
	var req apiv1.BranchRequest
	cmd := &cobra.Command{
		Use:   "branch ID --tag TAG [--mode diff|full|live] [--no-wait]",
		Short: "Snapshot a running sandbox into a new tag to fork from (it keeps running)",
		Long: "Snapshot a running sandbox: memory, processes, the Python session and files in its\n" +
			"overlay, as of now. The result is a tag `forkd fork` uses like any other.\n" +
			"Modes: diff (default: a short pause, copies the pages the sandbox wrote; a layer on the\n" +
			"sandbox's snapshot), full (the same pause, and a self-contained copy of all its memory;\n" +
			"works after the sandbox's snapshot was removed), live (the sandbox keeps running while\n" +
			"memory is captured).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := snapshot.ValidateNewTag(req.Tag); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			res, err := c.Branch(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(res)
			}
			if res.Snapshot.State == apiv1.SnapshotWriting {
				if res.Operation != nil {
					fmt.Printf("snapshot %s from %s: being written by operation %s; `forkd operation watch %s` follows it, `forkd operation cancel %s` cancels it\n",
						res.Snapshot.Tag, args[0], res.Operation.ID, res.Operation.ID, res.Operation.ID)
					return nil
				}
				fmt.Printf("snapshot %s from %s: being written; `forkd snapshot info %s` says when it is ready\n", res.Snapshot.Tag, args[0], res.Snapshot.Tag)
				return nil
			}
			fmt.Printf("snapshot %s from %s: paused %.1f ms, %s written, %.0f ms in all\n",
				res.Snapshot.Tag, args[0], res.PauseMillis, human(res.BytesWritten), res.TotalMillis)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Tag, "tag", "", "tag to create ("+snapshot.TagRule+")")
	cmd.Flags().StringVar(&req.Mode, "mode", "diff", "diff, full or live")
	cmd.Flags().BoolVar(&req.NoWait, "no-wait", false, "return at once; the tag is 'writing' until the branch is saved, then 'ready' (or 'failed')")
	cmd.MarkFlagRequired("tag")
	return cmd
}
