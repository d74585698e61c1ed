package main

import (
	"context"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/client"
)

// Shell completion of what the daemon knows: sandbox ids, snapshot tags,
// image digests and recipes. `forkd completion bash|zsh|fish` (cobra's)
// prints the scripts; they call `forkd __complete`, which lands here.
//
// A completion never starts a daemon and gives up after
// completionTimeout: a shell must not hang on a daemon that is down or
// slow; it then offers nothing (and files where a path also fits).

// completionTimeout bounds the API calls of one completion.
const completionTimeout = 2 * time.Second

// lister fetches candidates from the daemon; files: a path fits too
// (the shell then also offers files).
type lister struct {
	fetch func(ctx context.Context, c *client.Client) ([]string, error)
	files bool
}

var (
	sandboxIDs   = lister{fetch: listSandboxIDs}
	snapshotTags = lister{fetch: listSnapshotTags}
	imageRefs    = lister{fetch: listImageRefs}
	recipeNames  = lister{fetch: listRecipeNames, files: true} // or a .toml file
)

func listSandboxIDs(ctx context.Context, c *client.Client) ([]string, error) {
	sbs, err := c.Sandboxes(ctx, "", "")
	out := make([]string, len(sbs))
	for i, s := range sbs {
		out[i] = s.ID
	}
	return out, err
}

func listSnapshotTags(ctx context.Context, c *client.Client) ([]string, error) {
	snaps, err := c.Snapshots(ctx)
	out := make([]string, len(snaps))
	for i, s := range snaps {
		out[i] = s.Tag
	}
	return out, err
}

// listImageRefs lists image digests (short, as `forkd images` prints them) and
// recipe names, each of which `forkd image rm` takes.
func listImageRefs(ctx context.Context, c *client.Client) ([]string, error) {
	imgs, err := c.Images(ctx)
	var out []string
	for _, i := range imgs {
		out = append(out, shortDigest(i.Digest))
		if !slices.Contains(out, i.Recipe) {
			out = append(out, i.Recipe)
		}
	}
	return out, err
}

// listRecipeNames lists the recipes the daemon built images or snapshots of
// (it has no listing of its recipe directories).
func listRecipeNames(ctx context.Context, c *client.Client) ([]string, error) {
	imgs, err := c.Images(ctx)
	var out []string
	for _, i := range imgs {
		if !slices.Contains(out, i.Recipe) {
			out = append(out, i.Recipe)
		}
	}
	snaps, serr := c.Snapshots(ctx)
	for _, s := range snaps {
		if s.Recipe != "" && !slices.Contains(out, s.Recipe) {
			out = append(out, s.Recipe)
		}
	}
	if err == nil {
		err = serr
	}
	return out, err
}

// argCompletion says what a command's arguments are: every argument
// (many) or only the first.
type argCompletion struct {
	list lister
	many bool
}

// argCompletions and flagCompletions are keyed by command path without
// "forkd " (TestCompletionsNameRealCommands keeps them in step with the
// tree). A command that sets its own ValidArgsFunction keeps it.
var argCompletions = map[string]argCompletion{
	"sandbox info":     {sandboxIDs, false},
	"sandbox timeout":  {sandboxIDs, false},
	"sandbox network":  {sandboxIDs, false},
	"sandbox kill":     {sandboxIDs, true},
	"kill":             {sandboxIDs, true},
	"rm":               {sandboxIDs, true},
	"exec":             {sandboxIDs, false},
	"shell":            {sandboxIDs, false},
	"run-code":         {sandboxIDs, false},
	"branch":           {sandboxIDs, false},
	"port":             {sandboxIDs, false},
	"port-forward":     {sandboxIDs, false},
	"snapshot info":    {snapshotTags, false},
	"snapshot rm":      {snapshotTags, true},
	"snapshot share":   {snapshotTags, false},
	"snapshot unshare": {snapshotTags, false},
	"rmi":              {snapshotTags, true},
	"pack":             {snapshotTags, false},
	"image rm":         {imageRefs, true},
	"image build":      {recipeNames, false},
}

var flagCompletions = map[string]map[string]lister{
	"run":              {"tag": snapshotTags},
	"fork":             {"tag": snapshotTags},
	"ls":               {"tag": snapshotTags},
	"ps":               {"tag": snapshotTags},
	"sandbox ls":       {"tag": snapshotTags},
	"snapshot compact": {"from": snapshotTags},
	"snapshot create":  {"recipe": recipeNames},
	"bench spawn":      {"tag": snapshotTags, "recipe": recipeNames},
}

// registerCompletions wires argCompletions and flagCompletions into the
// commands under root.
func registerCompletions(root *cobra.Command, g *globals) {
	walkCommands(root, func(c *cobra.Command) {
		key := commandKey(c)
		if ac, ok := argCompletions[key]; ok && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
				if !ac.many && len(args) > 0 {
					return nil, cobra.ShellCompDirectiveDefault
				}
				return g.complete(cmd.Context(), ac.list, args)
			}
		}
		for flag, list := range flagCompletions[key] {
			c.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
				return g.complete(cmd.Context(), list, nil)
			})
		}
	})
}

// complete asks the daemon for candidates, leaving out those already
// given; nothing if it does not answer within completionTimeout.
func (g *globals) complete(ctx context.Context, list lister, given []string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	c, err := g.completionClient()
	if err != nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	names, _ := list.fetch(ctx, c) // what came before an error is still worth offering
	var out []cobra.Completion
	for _, n := range names {
		if !slices.Contains(given, n) {
			out = append(out, n)
		}
	}
	if list.files {
		return out, cobra.ShellCompDirectiveDefault
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completionClient is the API client of g's daemon, never starting one.
func (g *globals) completionClient() (*client.Client, error) {
	if g.host != "" {
		return client.NewRemote(client.Remote{Host: g.host, Token: g.token, CACert: g.caCert})
	}
	return client.New(g.socketPath()), nil
}
