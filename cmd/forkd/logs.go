package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/logfollow"
)

// unitName is the systemd unit packaging/forkd.service installs.
const unitName = "forkd.service"

// logsTail is how much of the log `forkd daemon logs` prints before it
// follows.
const logsTail = 64 << 10

func daemonLogsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs",
		Short: "Print the daemon's log (-f follows it); under systemd, its journal",
		Long: "Print the daemon's log: RUN_DIR/forkd.log for a daemon that `forkd daemon start` or\n" +
			"the CLI started, or the journal (journalctl -u forkd) for one that systemd runs.\n" +
			"-f keeps printing what it adds until Ctrl-C; it follows the file across truncation\n" +
			"and rotation.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if unit := g.daemonUnit(); unit != "" {
				return journal(ctx, unit, follow, g.jsonOut)
			}
			if follow {
				if g.jsonOut {
					return fmt.Errorf("--follow prints the log as it grows; --json prints it once: pick one: %w", errdefs.ErrInvalidArgument)
				}
				return logfollow.Follow(ctx, g.logPath(), os.Stdout, logfollow.Options{From: -logsTail})
			}
			log := tailFile(g.logPath(), logsTail)
			if g.jsonOut {
				return printJSON(map[string]any{"path": g.logPath(), "log": log})
			}
			if strings.TrimSpace(log) == "" {
				// Never a bare empty line: say where the log would be.
				fmt.Fprintln(os.Stderr, noLogMessage(g.logPath()))
				return nil
			}
			fmt.Println(log)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing the log as it grows, until Ctrl-C")
	return cmd
}

// noLogMessage says why `forkd daemon logs` printed nothing: the log
// file at path is empty or missing, and where else to look.
func noLogMessage(path string) string {
	if _, err := os.Stat(path); err != nil {
		return fmt.Sprintf("forkd: no daemon log: %s does not exist (no daemon was started by `forkd daemon start` or the CLI with this --run-dir; under systemd the log is in the journal: journalctl -u %s)", path, unitName)
	}
	return fmt.Sprintf("forkd: the daemon log %s is empty", path)
}

// daemonUnit is the systemd unit whose journal holds this daemon's log,
// or "": the unit of the running daemon's control group, or, when none
// runs and no log file of a CLI-started daemon exists, the installed
// forkd unit when journalctl is there (a stopped service's log is in the
// journal).
func (g *globals) daemonUnit() string {
	if pid, _ := daemonPID(g); pid > 0 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			return ""
		}
		return unitOfCgroup(data)
	}
	if _, err := os.Stat(g.logPath()); err == nil {
		return ""
	}
	if _, err := exec.LookPath("journalctl"); err != nil {
		return ""
	}
	for _, dir := range []string{"/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"} {
		if _, err := os.Stat(dir + "/" + unitName); err == nil {
			return unitName
		}
	}
	return ""
}

// unitOfCgroup returns the service unit named by a /proc/PID/cgroup's
// control group path when it is a system service (…/NAME.service), else
// "". Any service counts, so a renamed or templated unit works too.
func unitOfCgroup(data []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// v2: "0::/system.slice/forkd.service"; v1: "1:name=systemd:/system.slice/forkd.service".
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || (parts[1] != "" && parts[1] != "name=systemd") {
			continue
		}
		for _, el := range strings.Split(parts[2], "/") {
			if strings.HasSuffix(el, ".service") && !strings.HasPrefix(el, "user@") {
				return el
			}
		}
	}
	return ""
}

// journal prints (or follows) a unit's journal through journalctl.
func journal(ctx context.Context, unit string, follow, asJSON bool) error {
	args := []string{"--unit", unit, "--no-pager", "--lines", "500"}
	if follow {
		args = append(args, "--follow")
	}
	if asJSON {
		if follow {
			return fmt.Errorf("--follow prints the journal as it grows; --json prints it once: pick one: %w", errdefs.ErrInvalidArgument)
		}
		out, err := exec.CommandContext(ctx, "journalctl", append(args, "--output", "cat")...).Output()
		if err != nil {
			return fmt.Errorf("journalctl --unit %s: %w", unit, err)
		}
		return printJSON(map[string]any{"unit": unit, "log": strings.TrimSpace(string(out))})
	}
	cmd := exec.CommandContext(ctx, "journalctl", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Ctrl-C reaches journalctl too (same process group); a follow that
	// ends with it is not an error.
	if err := cmd.Run(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("journalctl --unit %s (reading the journal may need sudo or the systemd-journal group): %w", unit, err)
	}
	return nil
}
