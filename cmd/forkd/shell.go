package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/termio"
)

// loginShell runs bash as a login shell where the guest has it, else sh.
const loginShell = `if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l`

func shellCmd(g *globals) *cobra.Command {
	var env []string
	var cwd string
	cmd := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive shell in a sandbox (bash if the guest has it, else sh)",
		Long: "Open an interactive login shell in a sandbox: forkd exec -it ID with /bin/bash -l, or\n" +
			"/bin/sh -l where the guest has no bash. Your terminal is in raw mode until the shell\n" +
			"exits (Ctrl-C interrupts the guest's foreground command; Ctrl-D or `exit` leaves); the\n" +
			"guest terminal follows your window's size. forkd exits with the shell's exit code.\n" +
			"Needs a terminal on stdin.",
		Example: "  forkd shell sb-1\n" +
			"  forkd shell -w /srv -e FOO=bar sb-1",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := apiv1.ExecRequest{Shell: loginShell, Cwd: cwd, Env: map[string]string{}}
			if err := parseEnv(env, req.Env); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			return runInteractive(cmd.Context(), c, args[0], req, true, true)
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE added to the environment (repeatable)")
	f.StringVarP(&cwd, "cwd", "w", "", "working directory in the guest")
	return cmd
}

// parseEnv adds --env KEY=VALUE pairs to into.
func parseEnv(env []string, into map[string]string) error {
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--env %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
		into[k] = v
	}
	return nil
}

// runInteractive runs req over the exec WebSocket connected to this
// terminal (exec -i/-t, shell) and exits with the command's code.
func runInteractive(ctx context.Context, c *client.Client, id string, req apiv1.ExecRequest, input, tty bool) error {
	o := termio.Options{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Input: input, TTY: tty}
	if err := termio.CheckTTY(o); err != nil {
		return err
	}
	if tty {
		size := termio.Size(os.Stdin, os.Stdout)
		req.PTY = &size
	}
	// The terminal is untouched until the process runs: a dead sandbox
	// or a missing command is a plain error.
	sess, err := c.ExecSession(ctx, id, req)
	if err != nil {
		return err
	}
	sess.OnError = func(e *client.Error) { fmt.Fprintf(os.Stderr, "forkd: %s\r\n", e.Detail) }
	exit, err := termio.Run(ctx, sess, o)
	if err != nil {
		return err
	}
	if exit.TimedOut {
		fmt.Fprintln(os.Stderr, "forkd: command timed out; its process group was killed")
	}
	if code := termio.ExitCode(exit); code != 0 {
		return exitError{code}
	}
	return nil
}
