package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// sandboxCmd groups the commands about one sandbox, as `forkd snapshot`
// does for snapshots; fork, ls, kill, exec and cp stay top-level.
func sandboxCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Short: "Inspect, list and stop sandboxes"}
	info := &cobra.Command{
		Use:   "info ID",
		Short: "Show everything about a sandbox: state, why it died, timings, labels, timeouts, console tail",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			s, err := c.Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(s)
			}
			printSandbox(os.Stdout, s)
			return nil
		},
	}
	ls := lsCmd(g)
	ls.Aliases = []string{"list"}
	kill := killCmd(g)
	kill.Aliases = []string{"rm", "remove"}
	cmd.AddCommand(info, ls, kill, sandboxNetworkCmd(g), sandboxTimeoutCmd(g))
	return cmd
}

// sandboxTimeoutCmd extends or shortens a running sandbox's life.
func sandboxTimeoutCmd(g *globals) *cobra.Command {
	var idle time.Duration
	cmd := &cobra.Command{
		Use:   "timeout ID DURATION [--idle DURATION]",
		Short: "End a running sandbox DURATION from now (e.g. 30m; 0: never), whatever its timeout was",
		Example: "  forkd sandbox timeout sb-0123456789 2h\n" +
			"  forkd sandbox timeout sb-0123456789 0            # no limit: kill it yourself\n" +
			"  forkd sandbox timeout sb-0123456789 1h --idle 10m",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseLifetime(args[1])
			if err != nil {
				return err
			}
			secs := wholeSeconds(d)
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			s, err := c.SetLifetime(cmd.Context(), args[0], apiv1.SandboxPatch{
				TimeoutSeconds: &secs, IdleTimeoutSeconds: lifetimeFlag(cmd, "idle", idle),
			})
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(s)
			}
			if s.ExpiresAt == nil {
				fmt.Printf("%s: no timeout\n", s.ID)
			} else {
				fmt.Printf("%s: ends at %s (in %s)\n", s.ID, s.ExpiresAt.Local().Format(time.DateTime), time.Until(*s.ExpiresAt).Round(time.Second))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&idle, "idle", 0, "also set the idle timeout: end it after this long without requests (0: never)")
	return cmd
}

// maxLifetimeArg bounds what parseLifetime accepts before the daemon's own
// check (7 days): far above it, far below a Duration's overflow.
const maxLifetimeArg = 100 * 365 * 24 * time.Hour

// parseLifetime reads a timeout argument: a Go duration ("90s", "2h30m")
// or a bare number of seconds; "0" and "never" mean no limit.
func parseLifetime(s string) (time.Duration, error) {
	if s == "never" || s == "none" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 && n <= int64(maxLifetimeArg/time.Second) {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("timeout %q: want a duration such as 90s, 30m or 2h (0 or never: no limit): %w", s, errdefs.ErrInvalidArgument)
	}
	return d, nil
}

// printSandbox writes every field of s, multi-line ones (a dead reason, the
// console tail) indented under their label. Those two quote the guest's
// console: escaped, whatever daemon (or record of an older one) sent them.
func printSandbox(w io.Writer, s apiv1.Sandbox) {
	field := func(name, value string) {
		fmt.Fprintf(w, "%-14s%s\n", name+":", indentRest(value, 14))
	}
	field("id", s.ID)
	field("tag", s.Tag)
	field("state", s.State)
	if s.DeadReason != "" {
		field("dead reason", vmm.EscapeConsole(s.DeadReason))
	}
	field("created", s.Created.Local().Format(time.DateTime))
	if s.EndedAt != nil {
		field("ended", s.EndedAt.Local().Format(time.DateTime))
	}
	how := "a VMM started for it"
	switch {
	case s.Rehearsed:
		how = "a pooled VMM restored ahead, its first request rehearsed"
	case s.Pooled:
		how = "a pooled VMM"
	}
	field("ready", fmt.Sprintf("%.1f ms after taking its VMM (%s)", s.ReadyMillis, how))
	if s.PID != 0 {
		field("pid", fmt.Sprint(s.PID))
	}
	if s.NetNS != "" {
		field("netns", s.NetNS)
	}
	if s.GuestIP != "" {
		field("guest ip", s.GuestIP)
	}
	if s.Network != nil {
		field("network", policyString(s.Network.Policy))
		if st := s.Network.Stats; st != nil {
			field("traffic", fmt.Sprintf("%s sent, %s received, %d packets refused, %d spoofed",
				human(int64(st.TxBytes)), human(int64(st.RxBytes)), st.DeniedPackets, st.SpoofedPackets))
		}
	}
	if len(s.Metadata) > 0 {
		keys := make([]string, 0, len(s.Metadata))
		for k := range s.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		labels := make([]string, len(keys))
		for i, k := range keys {
			labels[i] = k + "=" + s.Metadata[k]
		}
		field("labels", strings.Join(labels, ", "))
	}
	expires := "never"
	if s.ExpiresAt != nil {
		expires = s.ExpiresAt.Local().Format(time.DateTime)
	}
	field("expires", expires)
	idle := "none"
	if s.IdleTimeoutSeconds > 0 {
		idle = (time.Duration(s.IdleTimeoutSeconds) * time.Second).String()
	}
	field("idle timeout", idle)
	if !s.LastActivity.IsZero() {
		field("last activity", s.LastActivity.Local().Format(time.DateTime))
	}
	if s.ConsoleTail != "" {
		fmt.Fprintln(w, "console tail:")
		for _, l := range strings.Split(strings.TrimRight(vmm.EscapeConsole(s.ConsoleTail), "\n"), "\n") {
			fmt.Fprintln(w, "  "+l)
		}
	}
}

// indentRest indents every line of s after the first by n spaces, so a
// multi-line value stays in its column.
func indentRest(s string, n int) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+strings.Repeat(" ", n))
}

// firstLine is s up to its first line break, marked when more follows.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if first, _, more := strings.Cut(s, "\n"); more {
		return strings.TrimSpace(first) + " …"
	}
	return s
}
