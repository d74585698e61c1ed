package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Docker-style names, where docker users type them: `forkd ps` lists
// sandboxes, `forkd rm` kills them (as `docker ps`, `docker rm -f`);
// `forkd images` and `forkd rmi` already exist. Kept few on purpose: each
// is listed in the README's CLI section.

// psCmd is `forkd ps`: `forkd ls`.
func psCmd(g *globals) *cobra.Command {
	c := lsCmd(g)
	c.Use, c.Short = "ps", "List sandboxes (as `forkd ls`)"
	return c
}

// rmCmd is `forkd rm ID...`: `forkd kill`.
func rmCmd(g *globals) *cobra.Command {
	c := killCmd(g)
	c.Use, c.Short = "rm ID... | --all", "Stop and forget sandboxes (as `forkd kill`)"
	return c
}

// guardGroups makes every command that only groups others (the root
// and the groups without a RunE of their own) fail on an argument that
// names no subcommand: "unknown command", the suggestions, exit 2.
// Without it cobra prints a group's help and exits 0 (it checks that a
// command can run before it checks its arguments), so a typo (`forkd
// sandbox rn`) looks like success. With no argument a group still prints
// its help.
func guardGroups(root *cobra.Command) {
	walkCommands(root, func(c *cobra.Command) {
		if c.Runnable() || !c.HasSubCommands() {
			return
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return unknownSubcommand(cmd, args[0])
		}
	})
}

// unknownSubcommand is the usage error for `forkd GROUP NAME` where the
// group has no subcommand NAME, with cobra's suggestions.
func unknownSubcommand(cmd *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which it sets on the root only
	}
	sugg := cmd.SuggestionsFor(name)
	for _, sub := range cmd.Commands() {
		alias := slices.ContainsFunc(sub.Aliases, func(a string) bool { return strings.HasPrefix(a, name) })
		if alias && sub.IsAvailableCommand() && !slices.Contains(sugg, sub.Name()) {
			sugg = append(sugg, sub.Name()) // cobra matches names only
		}
	}
	if len(sugg) > 0 {
		msg += "; did you mean " + strings.Join(sugg, " or ") + "?"
	}
	if !cmd.HasParent() { // the root's list is its --help
		return fmt.Errorf("%s (see `%s --help`): %w", msg, cmd.CommandPath(), errdefs.ErrInvalidArgument)
	}
	var names []string
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	return fmt.Errorf("%s (its commands: %s; see `%s --help`): %w", msg, strings.Join(names, ", "), cmd.CommandPath(), errdefs.ErrInvalidArgument)
}
