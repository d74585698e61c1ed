package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
)

// exitDetached is the exit status of a command that stopped following
// its operation on Ctrl-C: the work goes on (128 + SIGINT, as shells do).
const exitDetached = 130

// opFlags are the flags of a command that starts an operation.
type opFlags struct {
	// detach prints the operation id and returns at once.
	detach bool
}

func (f *opFlags) bind(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.detach, "detach", false, "print the operation id and return at once (follow it with `forkd operation watch ID`)")
}

// followOperation follows op until it ends and decodes its result into
// out. Its progress goes to stderr as --progress says (bars, lines, or
// NDJSON events with --json); with --json the result is the one JSON
// document on stdout. Ctrl-C detaches: the daemon goes on, and the
// message says how to re-attach or cancel. With detach it prints the
// operation and returns errDetached at once.
func followOperation(ctx context.Context, g *globals, c *client.Client, op apiv1.Operation, detach bool, out any) error {
	if detach {
		if g.jsonOut {
			printJSON(op)
		} else {
			fmt.Println(op.ID)
		}
		return errDetached
	}
	rep, err := g.reporter(op.Kind, false)
	if err != nil {
		return err
	}
	end, err := c.WatchOperation(ctx, op.ID, func(ev apiv1.OperationEvent) {
		switch {
		case ev.Message != "":
			rep.Step(ev.Message)
		case ev.TotalBytes > 0 || ev.DoneBytes > 0:
			total := ev.TotalBytes
			if total <= 0 {
				total = -1
			}
			rep.Bytes(ev.DoneBytes, total)
		case ev.Operation != nil && !ev.Operation.Terminal():
			// The first state: what ran before this client attached.
			for _, m := range ev.Operation.Progress {
				rep.Step(m)
			}
		}
	})
	if err == nil {
		err = client.OperationResult(end, out)
	}
	rep.Done(err)
	if err != nil && ctx.Err() != nil {
		fmt.Fprintf(os.Stderr, "detached from operation %s; it goes on in the daemon.\n  re-attach: forkd operation watch %s\n  cancel:    forkd operation cancel %s\n", op.ID, op.ID, op.ID)
		return exitError{exitDetached}
	}
	if err != nil {
		return err
	}
	if g.jsonOut {
		if out == nil {
			printJSON(end) // watch: the operation itself
		} else {
			printJSON(out)
		}
		return errDetached // printed
	}
	return nil
}

// errDetached tells a command that followOperation printed what there is
// to print.
var errDetached = errors.New("operation printed")

// printedOr is err, nil when followOperation already printed the outcome.
func printedOr(err error) (done bool, _ error) {
	if errors.Is(err, errDetached) {
		return true, nil
	}
	return err != nil, err
}

func operationCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "operation", Aliases: []string{"op"}, Short: "List, follow and cancel long operations (image builds, snapshot creates, compacts, background branches)"}
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "Operations of your tenant (all for an admin), oldest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			ops, err := c.Operations(cmd.Context())
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(ops)
			}
			tw := table("ID\tKIND\tTARGET\tSTATE\tCREATED\tDURATION")
			for _, op := range ops {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", op.ID, op.Kind, op.Target, opState(op), op.Created.Local().Format(time.DateTime), opDuration(op))
			}
			return tw.Flush()
		},
	}
	show := &cobra.Command{
		Use: "show ID", Short: "One operation: state, progress, result or error", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			op, err := c.Operation(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(op)
			}
			fmt.Printf("id:       %s\nkind:     %s\ntarget:   %s\nstate:    %s\ncreated:  %s (%s)\n", op.ID, op.Kind, op.Target, opState(op), op.Created.Local().Format(time.DateTime), opDuration(op))
			if op.Error != nil {
				fmt.Printf("error:    %s\n", op.Error.Detail)
			}
			if len(op.Progress) > 0 {
				fmt.Printf("progress:\n  %s\n", strings.Join(op.Progress, "\n  "))
			}
			return nil
		},
	}
	watch := &cobra.Command{
		Use: "watch ID", Short: "Follow an operation until it ends (Ctrl-C detaches again)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			op := apiv1.Operation{ID: args[0]}
			err = followOperation(cmd.Context(), g, c, op, false, nil)
			if done, err := printedOr(err); done {
				return err
			}
			fmt.Printf("operation %s succeeded\n", op.ID)
			return nil
		},
	}
	cancel := &cobra.Command{
		Use: "cancel ID", Short: "Cancel a running operation; what it staged is removed, no tag is left", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			if _, err := c.CancelOperation(cmd.Context(), args[0]); err != nil {
				return err
			}
			op, err := c.WatchOperation(cmd.Context(), args[0], nil)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(op)
			}
			if op.State == apiv1.OpSucceeded {
				fmt.Printf("operation %s had already finished its work: it succeeded\n", op.ID)
				return nil
			}
			fmt.Printf("operation %s %s\n", op.ID, op.State)
			return nil
		},
	}
	cmd.AddCommand(list, show, watch, cancel)
	return cmd
}

func opState(op apiv1.Operation) string {
	if op.State == apiv1.OpRunning && op.CancelRequested {
		return "cancelling"
	}
	return op.State
}

func opDuration(op apiv1.Operation) string {
	end := op.Updated
	if !op.Terminal() {
		end = time.Now()
	}
	return end.Sub(op.Created).Round(100 * time.Millisecond).String()
}
