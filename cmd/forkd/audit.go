package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/state"
)

// anchorReadTimeout is how long `audit verify` waits for read-only access
// to the state file; a running daemon holds it for good.
const anchorReadTimeout = time.Second

// verifyResult is `audit verify --json`: the report, and whether the log's
// end was compared with its anchor.
type verifyResult struct {
	audit.Report
	AnchorChecked bool   `json:"anchor_checked"`
	AnchorNote    string `json:"anchor_note,omitempty"`
}

// auditCmd reads the audit log directly from disk; it needs no daemon.
func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Verify and read the hash-chained audit log of API actions and sandbox lifecycle events",
	}
	var dir, statePath string
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "audit log directory (default DATA_DIR/audit)")
	cmd.PersistentFlags().StringVar(&statePath, "state", "", "state file holding the log's anchor (default DATA_DIR/state.db; with --dir, none unless given)")
	logDir := func() string {
		if dir != "" {
			return dir
		}
		return filepath.Join(g.dataDir, "audit")
	}
	// anchorFile is the state file to compare the log's end with; "" when
	// a log elsewhere (--dir, a backup copy, say) has no state file named.
	anchorFile := func() string {
		if statePath != "" || dir != "" {
			return statePath
		}
		return filepath.Join(g.dataDir, "state.db")
	}

	verify := &cobra.Command{
		Use:   "verify",
		Short: "Recompute the hash chain across all audit log files and compare its end with the anchor in the state file; name the first changed, removed or inserted record, or the records missing at the end, and exit 1",
		Long: "Recompute the hash chain across all audit log files and compare the log's end with\n" +
			"its anchor (the newest record's seq and hash, which the daemon stores in its state\n" +
			"file after every record): records cut from the end, a deleted audit.log or a changed\n" +
			"newest record show only there. The state file is opened read-only; a running daemon\n" +
			"holds it, so with the daemon running the chain is checked but the end is not (the\n" +
			"daemon compares it when it starts): stop the daemon for a complete check.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The anchor first: a record appended between the two reads
			// would look like a log past its anchor, never like a loss.
			res := verifyResult{}
			var anchor audit.Anchor
			switch path := anchorFile(); {
			case path == "":
				res.AnchorNote = "no state file given (--state): the end of the log was not compared with an anchor"
			default:
				a, err := state.ReadAuditAnchor(path, anchorReadTimeout)
				switch {
				case errdefs.IsNotFound(err) || errdefs.IsUnavailable(err):
					res.AnchorNote = "the end of the log was not compared with its anchor: " + err.Error()
				case err != nil:
					return err
				case a.Seq == 0:
					res.AnchorNote = "the state file " + path + " holds no anchor yet (the daemon stores one with its next record)"
				default:
					anchor, res.AnchorChecked = a, true
				}
			}
			rep, err := audit.VerifyAnchored(logDir(), anchor)
			if err != nil {
				return err
			}
			res.Report = rep
			switch {
			case g.jsonOut:
				if err := printJSON(res); err != nil {
					return err
				}
			case rep.OK && res.AnchorChecked:
				fmt.Printf("ok: %d records in %d files, chain intact, ends at its anchor (seq %d)\n", rep.Records, rep.Files, anchor.Seq)
			case rep.OK:
				fmt.Printf("ok: %d records in %d files, chain intact\nnote: %s\n", rep.Records, rep.Files, res.AnchorNote)
			default:
				fmt.Printf("FAILED (%s): %s\n%d records in chain order before it, %d files in %s\n",
					rep.Problem.Kind, rep.Problem.Message, rep.Records, rep.Files, rep.Dir)
				if rep.Anchor != nil && rep.Problem.File == "" { // the end differs from the anchor
					fmt.Println("fix: restore the files from a backup, or accept the log as it is with `forkd audit reset-anchor --i-know` (daemon stopped)")
				}
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
			tw := table("SEQ\tTIME\tACTION\tOUTCOME\tDURATION\tTOKEN\tTENANT\tPEER\tTARGETS\tREQUEST\tERROR")
			for _, r := range recs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.1fms\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Local().Format("2006-01-02 15:04:05.000"),
					r.Action, r.Outcome, r.DurationMillis, r.Token, r.Tenant, r.Peer, strings.Join(r.Targets, ","), r.RequestID, r.Error)
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

	var iKnow bool
	var reason string
	reset := &cobra.Command{
		Use:   "reset-anchor --i-know [--reason TEXT]",
		Short: "Accept an audit log that no longer matches its anchor (records lost at its end): record the loss in the log and anchor it where it ends; run with the daemon stopped",
		Long: "When the daemon refuses to start because the audit log ends before its anchor (records\n" +
			"cut from the end, audit.log deleted, the newest rotated files removed) or its newest\n" +
			"record changed, and the files cannot be restored from a backup, this appends an\n" +
			"audit.anchor_reset record, chained to the log's newest record, whose detail names the\n" +
			"anchor, where the log ended, the missing records and --reason, and anchors the log\n" +
			"there: the records after it are a new segment of the chain. Without --i-know it only\n" +
			"says what it would record.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := anchorFile()
			if path == "" {
				return fmt.Errorf("--dir needs --state: the state file that holds this log's anchor: %w", errdefs.ErrInvalidArgument)
			}
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("state file %s: %w", path, err)
			}
			st, err := state.Open(path) // exclusive: fails while a daemon runs
			if err != nil {
				return err
			}
			defer st.Close()
			if !iKnow {
				a, err := st.AuditAnchor()
				if err != nil {
					return fmt.Errorf("%w\npass --i-know to record this and anchor the log where it ends", err)
				}
				rep, err := audit.VerifyAnchored(logDir(), a)
				if err != nil {
					return err
				}
				if rep.OK {
					fmt.Printf("the log ends at its anchor (seq %d): nothing to reset\n", rep.Head.Seq)
					return nil
				}
				if rep.Problem.File != "" {
					return fmt.Errorf("%s\nthis is damage inside the log, not at its end: see `forkd audit verify` and `forkd audit repair`; reset-anchor does not change it: %w",
						rep.Problem.Message, errdefs.ErrFailedPrecondition)
				}
				return fmt.Errorf("%s\nrestore the files from a backup if you can; otherwise pass --i-know to append, after seq %d, an %s record naming this, and anchor the log there: %w",
					rep.Problem.Message, rep.Head.Seq, audit.ActionAnchorReset, errdefs.ErrFailedPrecondition)
			}
			peer := fmt.Sprintf("cli:uid=%d,pid=%d", os.Getuid(), os.Getpid())
			res, err := audit.ResetAnchor(logDir(), audit.Options{Anchor: st}, peer, reason)
			if err != nil {
				return err
			}
			switch {
			case g.jsonOut:
				return printJSON(res)
			case res.Reset:
				fmt.Printf("recorded %s as seq %d (%s); the log is anchored there\n", audit.ActionAnchorReset, res.Record.Seq, res.Problem.Message)
			default:
				fmt.Printf("the log ends at its anchor (seq %d): nothing to reset\n", res.Head.Seq)
			}
			return nil
		},
	}
	reset.Flags().BoolVar(&iKnow, "i-know", false, "really record the loss and anchor the log where it ends")
	reset.Flags().StringVar(&reason, "reason", "", "why, recorded in the audit.anchor_reset record (e.g. \"no backup of audit.log after disk failure\")")
	cmd.AddCommand(verify, tail, repair, reset)
	return cmd
}
