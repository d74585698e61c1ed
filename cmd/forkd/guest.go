package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/termio"
)

func execCmd(g *globals) *cobra.Command {
	var env []string
	var cwd string
	var timeout time.Duration
	var shell, interactive, tty bool
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with the command's code",
		Long: "Run a command in a sandbox. Output streams as it is produced; forkd exits with the guest\n" +
			"command's exit code (124 on timeout). Stdin is forwarded when it is not a terminal.\n" +
			"With --shell, the single argument is run by /bin/sh -c.\n" +
			"With --json, stdout carries the API's NDJSON events instead, one per line as they\n" +
			"arrive: {\"type\":\"start\",\"pid\":N} (the guest pid), {\"type\":\"stdout\"|\"stderr\",\n" +
			"\"data\":BASE64} chunks, then one {\"type\":\"exit\",\"exit_code\":N,...}; forkd still\n" +
			"exits with the command's code.\n\n" +
			"Interactive, like docker: -i keeps stdin open and streams it; -t runs the command on a\n" +
			"terminal in the guest sized like yours (following resizes). With -it your terminal is in\n" +
			"raw mode until the command exits: keys, Ctrl-C included, go to the guest (Ctrl-C interrupts\n" +
			"the guest's foreground process). -t with -i needs a terminal on stdin (an error otherwise);\n" +
			"-t alone runs on a guest terminal with no input. A command killed by signal N exits\n" +
			"128+N. See also `forkd shell`.",
		Example: "  forkd exec sb-1 -- uname -a\n" +
			"  forkd exec --shell sb-1 -- 'ls /tmp | wc -l'\n" +
			"  echo hi | forkd exec sb-1 -- cat\n" +
			"  forkd exec -it sb-1 -- python3\n" +
			"  forkd exec -it -e TERM=vt100 -w /srv sb-1 -- top",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := apiv1.ExecRequest{Cwd: cwd, TimeoutMillis: timeout.Milliseconds(), Env: map[string]string{}}
			if shell {
				req.Shell = strings.Join(args[1:], " ")
			} else {
				req.Argv = args[1:]
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--env %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
				}
				req.Env[k] = v
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			if interactive || tty {
				if g.jsonOut {
					return fmt.Errorf("-i and -t do not go with --json: %w", errdefs.ErrInvalidArgument)
				}
				return runInteractive(cmd.Context(), c, args[0], req, interactive, tty)
			}
			req.Stdin = !isTerminal(os.Stdin)
			var ev apiv1.ExecEvent
			if g.jsonOut {
				// Output and exit as one stream of events: a script
				// never has to tell the command's output from forkd's.
				enc := json.NewEncoder(os.Stdout)
				ev, err = c.ExecEvents(cmd.Context(), args[0], req, os.Stdin, func(ev apiv1.ExecEvent) error { return enc.Encode(ev) })
			} else {
				ev, err = c.Exec(cmd.Context(), args[0], req, os.Stdin, os.Stdout, os.Stderr)
			}
			if err != nil {
				return err
			}
			switch {
			case ev.TimedOut:
				if !g.jsonOut {
					fmt.Fprintf(os.Stderr, "forkd: command timed out after %s; its process group was killed\n", timeout)
				}
				return exitError{124}
			case ev.Signal != "":
				return exitError{termio.ExitStatus(ev.ExitCode, ev.Signal, false)}
			case ev.ExitCode != 0:
				return exitError{ev.ExitCode}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE added to the environment (repeatable)")
	f.StringVarP(&cwd, "cwd", "w", "", "working directory in the guest")
	f.DurationVar(&timeout, "timeout", 0, "kill the command's process group after this long (e.g. 30s)")
	f.BoolVar(&shell, "shell", false, "run the command line with /bin/sh -c")
	f.BoolVarP(&interactive, "interactive", "i", false, "keep stdin open and stream it to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal in the guest (raw local terminal with -i)")
	return cmd
}

func runCodeCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "run-code ID [CODE|-]",
		Short: "Run Python in the sandbox's persistent session (variables persist across calls)",
		Long:  "Run Python code in the sandbox's warmed session. CODE '-' or no CODE reads stdin.\nPrints stdout, stderr and the value of the last expression; exits 1 on a Python error.",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var code string
			if len(args) == 1 || args[1] == "-" {
				data, err := readAllLimited(os.Stdin, 4<<20)
				if err != nil {
					return err
				}
				code = string(data)
			} else {
				code = args[1]
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			res, err := c.RunCode(cmd.Context(), args[0], apiv1.RunCodeRequest{Code: code, TimeoutMillis: timeout.Milliseconds()})
			if err != nil {
				return err
			}
			if g.jsonOut {
				printJSON(res)
			} else {
				fmt.Fprint(os.Stdout, res.Stdout)
				fmt.Fprint(os.Stderr, res.Stderr)
				if v, ok := res.Result["text/plain"]; ok {
					fmt.Println(v)
				}
				if res.Error != nil {
					fmt.Fprint(os.Stderr, codeErrorText(res.Error))
				}
			}
			if res.Error != nil {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "interrupt the code after this long; the session survives")
	return cmd
}

// codeErrorText is what run-code prints for a Python error: its traceback,
// which ends with "Name: Value" as Python prints it, or that line alone for
// an error without a traceback (a timeout, a session that died), or after a
// traceback that ends otherwise (KeyboardInterrupt under a timeout).
func codeErrorText(e *apiv1.CodeError) string {
	tb := strings.TrimRight(e.Traceback, "\n")
	last := e.Name
	if e.Value != "" {
		last = strings.TrimPrefix(last+": "+e.Value, ": ")
	}
	if last != "" && !strings.HasSuffix(tb, last) {
		if tb != "" {
			tb += "\n"
		}
		tb += last
	}
	if tb == "" {
		tb = "Python error (no name, value or traceback)"
	}
	return tb + "\n"
}

// parseMode reads permission bits in octal, as chmod takes them: 644, 0644
// or 0o644.
func parseMode(s string) (uint32, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || t == "" || v > 0o7777 {
		return 0, fmt.Errorf("--mode %q: want octal permission bits like 0644 or 755: %w", s, errdefs.ErrInvalidArgument)
	}
	return uint32(v), nil
}

// localFileInfo describes a file cp wrote on this host, in the shape cp
// prints for a file it wrote in a sandbox.
func localFileInfo(path string) (apiv1.FileInfo, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return apiv1.FileInfo{}, err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return apiv1.FileInfo{}, err
	}
	return apiv1.FileInfo{Name: st.Name(), Path: abs, Size: st.Size(), Mode: uint32(st.Mode().Perm()), ModTime: st.ModTime()}, nil
}

// splitRemote parses "ID:/path". A local path has no colon before its first
// slash.
func splitRemote(arg string) (id, path string, ok bool) {
	i := strings.Index(arg, ":")
	if i <= 0 || strings.Contains(arg[:i], "/") {
		return "", "", false
	}
	return arg[:i], arg[i+1:], true
}

func cpCmd(g *globals) *cobra.Command {
	var modeArg string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (ID:/path on one side; '-' is stdin/stdout)",
		Long: "Copy a file into or out of a sandbox (ID:/path on one side; '-' is stdin/stdout).\n" +
			"With --json, prints the file written (name, path, size, mode, mod_time), except when\n" +
			"the destination is '-': stdout then carries the file's bytes only. Progress goes to\n" +
			"stderr (--progress; NDJSON events with --json).",
		Example: "  forkd cp data.csv sb-abc:/root/data.csv\n  forkd cp sb-abc:/root/out.json ./out.json\n  echo hi | forkd cp - sb-abc:/tmp/hi.txt",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return fmt.Errorf("cp needs exactly one side in a sandbox, written ID:/path: %w", errdefs.ErrInvalidArgument)
			}
			mode, err := parseMode(modeArg)
			if err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := g.reporter("cp", args[1] == "-")
			if err != nil {
				return err
			}
			var fi apiv1.FileInfo
			if dstRemote {
				fi, err = copyIn(cmd.Context(), c, rep, args[0], dstID, dstPath, mode)
			} else {
				fi, err = copyOut(cmd.Context(), c, rep, srcID, srcPath, args[1])
			}
			rep.Done(err)
			switch {
			case err != nil:
				return err
			case args[1] == "-":
				return nil // stdout carried the file
			case g.jsonOut:
				return printJSON(fi)
			case dstRemote:
				fmt.Fprintf(os.Stderr, "copied %s to %s:%s\n", human(fi.Size), dstID, fi.Path)
			default:
				fmt.Fprintf(os.Stderr, "copied %s to %s\n", human(fi.Size), fi.Path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&modeArg, "mode", "0644", "permission bits (octal) of a file copied in")
	return cmd
}
