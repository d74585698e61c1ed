package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/audit"
)

// auditCmd reads the audit log directly from disk; it needs no daemon.
func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Verify and read the hash-chained audit log of API actions and sandbox lifecycle events",
	}
	var dir string
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "audit log directory (default DATA_DIR/audit)")
	logDir := func() string {
		if dir != "" {
			return dir
		}
		return filepath.Join(g.dataDir, "audit")
	}

	verify := &cobra.Command{
		Use:   "verify",
		Short: "Recompute the hash chain across all audit log files; name the first changed, removed or inserted record and exit 1",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := audit.Verify(logDir())
			if err != nil {
				return err
			}
			switch {
			case g.jsonOut:
				if err := printJSON(rep); err != nil {
					return err
				}
			case rep.OK:
				fmt.Printf("ok: %d records in %d files, chain intact\n", rep.Records, rep.Files)
			default:
				fmt.Printf("FAILED (%s): %s\n%d records in chain order before it, %d files in %s\n",
					rep.Problem.Kind, rep.Problem.Message, rep.Records, rep.Files, rep.Dir)
			}
			if !rep.OK {
				return exitError{1}
			}
			return nil
		},
	}

	var n int
	tail := &cobra.Command{
		Use:   "tail [-n N]",
		Short: "Print the last N audit records, oldest first (the chain is not checked; use verify)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs, err := audit.Tail(logDir(), n)
			if err != nil {
				return err
			}
			if g.jsonOut {
				if recs == nil {
					recs = []audit.Record{}
				}
				return printJSON(recs)
			}
			tw := table("SEQ\tTIME\tACTION\tOUTCOME\tDURATION\tTOKEN\tPEER\tTARGETS\tREQUEST\tERROR")
			for _, r := range recs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.1fms\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Local().Format("2006-01-02 15:04:05.000"),
					r.Action, r.Outcome, r.DurationMillis, r.Token, r.Peer, strings.Join(r.Targets, ","), r.RequestID, r.Error)
			}
			return tw.Flush()
		},
	}
	tail.Flags().IntVarP(&n, "lines", "n", 20, "number of records")

	repair := &cobra.Command{
		Use:   "repair",
		Short: "Cut an incomplete final line, left by a crash mid-write, from audit.log (its bytes are kept aside); run with the daemon stopped",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := audit.Repair(logDir())
			if err != nil {
				return err
			}
			switch {
			case g.jsonOut:
				return printJSON(res)
			case res.Repaired:
				fmt.Printf("cut the incomplete line %d of %s (%d bytes, never acknowledged), kept in %s\n", res.Line, res.File, res.Bytes, res.SavedTo)
			default:
				fmt.Println("nothing to repair: audit.log ends with a complete record")
			}
			return nil
		},
	}
	cmd.AddCommand(verify, tail, repair)
	return cmd
}
