package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	forkdmcp "github.com/forkd-dev/forkd/internal/mcp"
)

// mcpCmd serves forkd's MCP tools over stdio. Its tools are calls through
// the same API client as every other command (the local socket, started
// if needed, or --host with --token), so the daemon authorizes and audits
// them as this process's requests.
func mcpCmd(g *globals) *cobra.Command {
	var verbose bool
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve forkd's tools to an MCP client (Model Context Protocol) over stdio",
		Long: `Serve forkd's tools over the Model Context Protocol on stdin/stdout, for MCP
clients such as coding agents and desktop assistants:

  create_sandbox, fork_sandboxes, run_code, run_command, read_file, write_file,
  list_files, branch_sandbox, list_sandboxes, kill_sandbox, list_snapshots,
  expose_port

Each tool call is an API request to the daemon: the local one (its socket,
started if none is running) or --host/FORKD_HOST with --token/FORKD_TOKEN.
A client configuration typically reads:

  {"command": "forkd", "args": ["mcp"]}

The daemon also serves the same tools over streamable HTTP at /mcp, behind
its usual authentication.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			// stdout is the protocol channel: logs go to stderr, and only
			// with --verbose.
			var logger *slog.Logger
			if verbose {
				logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			} else {
				logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			}
			opts := forkdmcp.Options{Version: version, Logger: logger}
			// expose_port's URLs: on the --host daemon, or through the
			// socket this process uses.
			if g.host != "" {
				opts.BaseURL = g.host
			} else {
				opts.Socket = g.socketPath()
			}
			s := forkdmcp.NewServer(c, opts)
			if err := s.Run(cmd.Context(), &mcp.StdioTransport{}); err != nil && cmd.Context().Err() == nil {
				return fmt.Errorf("mcp: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log MCP server events to stderr")
	return cmd
}
