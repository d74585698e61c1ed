// Package mcp is forkd's Model Context Protocol server: tools that let an
// LLM agent create, fork, branch and kill sandboxes and run code, commands
// and file operations in them.
//
// The tools never touch the engine. They act through a Backend, which is
// the API client (internal/client): every tool call is one or more ordinary
// REST calls, so it is authorized, limited, validated and audited exactly
// like the same call made by the CLI or an SDK. Two front ends serve the
// same tools:
//
//   - `forkd mcp` (cmd/forkd/mcp.go) speaks MCP over stdio and uses the
//     CLI's client: the local socket (the audit log names the peer's uid and
//     pid) or --host with a bearer token (the audit log names the token).
//   - The daemon serves the streamable HTTP transport at /mcp
//     (internal/api/mcp.go). There the Backend is a client whose transport
//     calls the API's own handler in-process, carrying the identity of the
//     /mcp request it serves (its Authorization header, socket peer and
//     request id), so a tool call passes the same token check and leaves
//     the same audit record as the REST request it makes.
//
// Tool failures (a sandbox that does not exist, a command that cannot
// start, invalid arguments) are tool results with isError set and the
// daemon's message, which the model can read and act on; a command that
// exits non-zero or Python code that raises is a normal result that says
// so. Results carry readable text, structured output (the tool's output
// schema) and, from run_code, images as MCP image content.
package mcp

import (
	"context"
	"io"
	"log/slog"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
)

// Backend is what the tools need from forkd: a subset of the API client's
// methods, with its semantics (errors are *client.Error, unwrapping to the
// errdefs class of the daemon's problem).
type Backend interface {
	Fork(ctx context.Context, req apiv1.ForkRequest) (apiv1.ForkResponse, error)
	Sandboxes(ctx context.Context, tag, state string, labels ...string) ([]apiv1.Sandbox, error)
	Kill(ctx context.Context, ids []string, all bool) ([]string, error)
	Exec(ctx context.Context, id string, req apiv1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExecEvent, error)
	RunCode(ctx context.Context, id string, req apiv1.RunCodeRequest) (apiv1.RunCodeResult, error)
	ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (apiv1.FileInfo, error)
	ListFiles(ctx context.Context, id, path string) ([]apiv1.FileInfo, error)
	Mkdir(ctx context.Context, id string, req apiv1.MkdirRequest) (apiv1.FileInfo, error)
	Branch(ctx context.Context, id string, req apiv1.BranchRequest) (apiv1.BranchResponse, error)
	Snapshots(ctx context.Context) ([]apiv1.Snapshot, error)
	Port(ctx context.Context, id string, port int) (apiv1.Port, error)
}

var _ Backend = (*client.Client)(nil)

// Options configure a server.
type Options struct {
	// Version is forkd's version, reported to clients.
	Version string
	// Logger receives the SDK's logs (nil: none).
	Logger *slog.Logger
	// BaseURL is the URL clients reach the daemon's API at
	// (https://HOST:PORT), from which expose_port makes absolute URLs;
	// empty when unknown (the tools then give the port's path on the API).
	BaseURL string
	// Socket is the daemon's Unix socket when the backend talks through
	// it and BaseURL is empty: expose_port's URL is then
	// http://forkd/PATH, reachable through that socket only.
	Socket string
}

// instructions is what clients may show the model about the server as a
// whole.
const instructions = `forkd runs code in isolated microVM sandboxes forked in milliseconds from warmed snapshots.
Typical flow: list_snapshots to see the tags you can fork (those with python=true support run_code);
create_sandbox with a tag (or fork_sandboxes for several identical copies); then run_command, run_code,
write_file, read_file and list_files with the sandbox id; branch_sandbox saves a running sandbox as a new
tag to fork from later; kill_sandbox when you are done (sandboxes also end at their timeout).
What a sandbox may reach on the network is its policy: the network argument of create_sandbox and fork_sandboxes
(none, public, or allow with a list of networks and domain names), else the snapshot's, else the daemon's default.
To reach a server running in a sandbox (a web app on a port), use expose_port.`

// NewServer returns an MCP server whose tools act through b.
func NewServer(b Backend, opts Options) *mcp.Server {
	v := opts.Version
	if v == "" {
		v = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "forkd", Title: "forkd sandboxes", Version: v}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       opts.Logger,
	})
	addTools(s, &tools{b: b, opts: opts})
	return s
}

// NewHTTPHandler serves s over MCP's streamable HTTP transport, statelessly:
// every POST is a complete exchange on a temporary session, so each tool
// call runs in the context of the HTTP request that carried it (its
// identity included, see internal/api/mcp.go) and no session outlives its
// request. GET and DELETE, which only stateful servers use, are answered
// 405. The handler does no authentication of its own: mount it behind the
// API's.
func NewHTTPHandler(s *mcp.Server, logger *slog.Logger) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{
		Stateless: true,
		Logger:    logger,
	})
}
