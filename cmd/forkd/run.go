package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/termio"
)

// `forkd run`: docker run for snapshots. One sandbox is forked, the
// command runs in it with its output streamed, and the sandbox is killed
// after it (unless --keep); forkd exits with the command's code.
//
// Whatever happens to the CLI, the sandbox does not outlive it for long:
// a sandbox to be removed is forked with an idle timeout (runIdleTimeout)
// that the command's own stream keeps at bay while it runs (a request in
// flight is not idleness), and with --timeout with a lifetime of that
// plus runTimeoutMargin. A CLI killed with SIGKILL leaves the sandbox
// to those.

const (
	// runIdleTimeout ends a sandbox of `forkd run` whose CLI went away
	// (no stream, no request) this long after.
	runIdleTimeout = 2 * time.Minute
	// runTimeoutMargin is added to --timeout for the sandbox's lifetime:
	// the fork and the kill after the command need their time.
	runTimeoutMargin = time.Minute
	// runCleanupTimeout bounds the kill after the command (or after
	// Ctrl-C), which must not hang a CLI whose daemon went away.
	runCleanupTimeout = 30 * time.Second
	// runLabel marks the sandboxes of one `forkd run`, so one forked by a
	// fork request cut by Ctrl-C can still be found and killed.
	runLabel = "forkd.run"
)

// runFlags are `forkd run`'s flags.
type runFlags struct {
	tag     string
	pull    string // --pull-policy
	remove  bool
	keep    bool
	timeout time.Duration
	env     []string
	cwd     string
	labels  []string
	network string
	cpus    float64
	shell   bool
}

func dockerRunCmd(g *globals) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run --tag TAG|REF [flags] [-- CMD [ARG...]]",
		Short: "Fork a sandbox, run a command in it streaming its output, then kill it; exits with the command's code",
		Long: "Fork one sandbox from TAG, run CMD in it with stdout and stderr streamed (stdin too when\n" +
			"it is not a terminal), and kill the sandbox afterwards (--rm, the default) unless --keep.\n" +
			"Without CMD it runs the image's default command (an OCI image's Entrypoint and Cmd).\n" +
			"forkd exits with the command's exit code: 128+N when a signal N ended it, 124 when\n" +
			"--timeout did, 130 on Ctrl-C (the sandbox is killed then too, unless --keep).\n" +
			"A sandbox to be removed is forked with an idle timeout of " + runIdleTimeout.String() + " and, with --timeout,\n" +
			"a lifetime of the timeout plus " + runTimeoutMargin.String() + ", so a CLI that dies leaves nothing running for long.",
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInSandbox(cmd, g, f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.tag, "tag", "", "snapshot tag to fork from, or a registry reference HOST[:PORT]/REPOSITORY:TAG that the daemon pulls on first use")
	fl.StringVar(&f.pull, "pull-policy", "", pullPolicyHelp)
	fl.BoolVar(&f.remove, "rm", true, "kill the sandbox when the command ends (the default; for docker users)")
	fl.BoolVar(&f.keep, "keep", false, "keep the sandbox running afterwards and print its id (same as --rm=false)")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command after this long (exit 124); the sandbox ends a minute later at most")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "KEY=VALUE added to the command's environment (repeatable)")
	fl.StringVarP(&f.cwd, "cwd", "w", "", "working directory in the guest")
	fl.BoolVar(&f.shell, "shell", false, "run the single argument with /bin/sh -c")
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "metadata label key=value of the sandbox (repeatable)")
	fl.StringVar(&f.network, "network", "", "egress policy of the sandbox (default: the snapshot's, else the daemon's): "+policyHelp)
	fl.Float64Var(&f.cpus, "cpus", 0, "CPU limit of the sandbox, e.g. 0.5")
	cmd.MarkFlagRequired("tag")
	return cmd
}

// runInSandbox is `forkd run`'s body.
func runInSandbox(cmd *cobra.Command, g *globals, f runFlags, args []string) error {
	fork := apiv1.ForkRequest{Tag: f.tag, Count: 1}
	if err := forkSource(cmd.Context(), &fork, f.pull); err != nil {
		return err
	}
	if f.keep && cmd.Flags().Changed("rm") && f.remove {
		return fmt.Errorf("--rm and --keep contradict each other: pick one: %w", errdefs.ErrInvalidArgument)
	}
	remove := f.remove && !f.keep
	exec := apiv1.ExecRequest{Cwd: f.cwd, TimeoutMillis: f.timeout.Milliseconds(), Env: map[string]string{}}
	if f.shell && len(args) == 0 {
		return fmt.Errorf("--shell needs the command to run: %w", errdefs.ErrInvalidArgument)
	}
	if f.shell {
		exec.Shell = strings.Join(args, " ")
	} else {
		exec.Argv = args
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--env %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
		}
		exec.Env[k] = v
	}
	exec.Stdin = !isTerminal(os.Stdin)
	meta, err := parseLabels(f.labels)
	if err != nil {
		return err
	}
	if meta == nil {
		meta = map[string]string{}
	}
	meta[runLabel] = runNonce()
	pol, err := policyFlag(f.network)
	if err != nil {
		return err
	}
	fork.Metadata, fork.Network, fork.CPUs = meta, pol, f.cpus
	if remove {
		fork.IdleTimeoutSeconds = wholeSeconds(runIdleTimeout)
		if f.timeout > 0 {
			secs := wholeSeconds(f.timeout + runTimeoutMargin)
			fork.TimeoutSeconds = &secs
		}
	}

	// Which signal interrupted us decides the exit code (130 for Ctrl-C).
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var caught atomic.Int32 // the signal's number; 0: none yet
	go func() {
		select {
		case sig := <-sigs:
			caught.Store(int32(sig.(syscall.Signal)))
			cancel()
		case <-ctx.Done():
		}
	}()
	// interrupted is the exit code of a run a signal ended: main's own
	// handler may cancel first, so an unknown signal is Ctrl-C's.
	interrupted := func() (int, bool) {
		if ctx.Err() == nil {
			return 0, false
		}
		if caught.Load() == int32(syscall.SIGTERM) {
			return 128 + int(syscall.SIGTERM), true
		}
		return 128 + int(syscall.SIGINT), true
	}

	c, err := g.client(ctx)
	if err != nil {
		return err
	}
	cleanup := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), runCleanupTimeout)
	}
	resp, err := c.Fork(ctx, fork)
	if err != nil {
		if code, ok := interrupted(); ok {
			// The fork may still complete on the daemon: find it by label.
			cctx, ccancel := cleanup()
			defer ccancel()
			killLabelled(cctx, c, meta[runLabel])
			return exitError{code}
		}
		return fmt.Errorf("run: fork from %q: %w", f.tag, err)
	}
	id := resp.Sandboxes[0].ID
	var ev apiv1.ExecEvent
	var execErr error
	if len(args) == 0 {
		exec.Argv, execErr = defaultCommand(ctx, c, id)
	}
	if execErr == nil {
		ev, execErr = runExec(ctx, g, c, id, exec)
	}
	code, stopped := interrupted()
	if remove {
		cctx, ccancel := cleanup()
		defer ccancel()
		if _, err := c.Kill(cctx, []string{id}, false); err != nil && !errdefs.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "forkd: could not kill sandbox %s (its idle timeout ends it): %v\n", id, err)
		}
	} else if !g.jsonOut {
		fmt.Fprintf(os.Stderr, "forkd: sandbox %s kept running (`forkd rm %s` removes it)\n", id, id)
	}
	switch {
	case stopped:
		return exitError{code}
	case execErr != nil:
		return fmt.Errorf("run in sandbox %s: %w", id, execErr)
	case ev.TimedOut:
		if !g.jsonOut {
			fmt.Fprintf(os.Stderr, "forkd: command timed out after %s; its process group was killed\n", f.timeout)
		}
		return exitError{124}
	case ev.Signal != "":
		return exitError{termio.ExitStatus(ev.ExitCode, ev.Signal, false)}
	case ev.ExitCode != 0:
		return exitError{ev.ExitCode}
	}
	return nil
}

// runExec runs req in sandbox id, streaming its output (with --json, the
// API's NDJSON events, as `forkd exec --json` does).
func runExec(ctx context.Context, g *globals, c *client.Client, id string, req apiv1.ExecRequest) (apiv1.ExecEvent, error) {
	if g.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		return c.ExecEvents(ctx, id, req, os.Stdin, func(ev apiv1.ExecEvent) error { return enc.Encode(ev) })
	}
	return c.Exec(ctx, id, req, os.Stdin, os.Stdout, os.Stderr)
}

// killLabelled kills the sandboxes labelled runLabel=nonce, best effort.
func killLabelled(ctx context.Context, c *client.Client, nonce string) {
	sbs, err := c.Sandboxes(ctx, "", "", runLabel+"="+nonce)
	if err != nil || len(sbs) == 0 {
		return
	}
	ids := make([]string, len(sbs))
	for i, s := range sbs {
		ids[i] = s.ID
	}
	if _, err := c.Kill(ctx, ids, false); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(os.Stderr, "forkd: could not kill sandbox %s: %v\n", strings.Join(ids, ", "), err)
	}
}

// runNonce names one `forkd run`'s sandboxes.
func runNonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxImageConfigBytes bounds the image configuration read from a guest.
const maxImageConfigBytes = 256 << 10

// defaultCommand is the default command of sandbox id's image: its OCI
// image's Entrypoint followed by its Cmd, as docker run takes them.
func defaultCommand(ctx context.Context, c *client.Client, id string) ([]string, error) {
	var buf limitedBuffer
	buf.max = maxImageConfigBytes
	if _, err := c.ReadFile(ctx, id, agentapi.ImageConfigPath, &buf); err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("run: the image of %s has no default command (it was not built from an OCI image); give one after --: %w", id, errdefs.ErrInvalidArgument)
		}
		return nil, fmt.Errorf("run: reading the image's default command: %w", err)
	}
	var cfg agentapi.ImageConfig
	if err := json.Unmarshal(buf.b, &cfg); err != nil {
		return nil, fmt.Errorf("run: %s in the sandbox is not an image configuration: %v: %w", agentapi.ImageConfigPath, err, errdefs.ErrInvalidArgument)
	}
	argv := append(append([]string(nil), cfg.Entrypoint...), cfg.Cmd...)
	if len(argv) == 0 {
		return nil, fmt.Errorf("run: the image of %s has neither Entrypoint nor Cmd; give a command after --: %w", id, errdefs.ErrInvalidArgument)
	}
	return argv, nil
}

// limitedBuffer keeps what is written to it up to max bytes, and fails
// past that (a guest's file is untrusted input).
type limitedBuffer struct {
	b   []byte
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.max {
		return 0, fmt.Errorf("more than %d bytes: %w", l.max, errdefs.ErrResourceExhausted)
	}
	l.b = append(l.b, p...)
	return len(p), nil
}
