package mcp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// Sandbox networking (the network argument of create_sandbox and
// fork_sandboxes) and ports (expose_port).

// networkModes are the policy modes a tool accepts.
var networkModes = []string{"none", "public", "allow"}

// NetworkInput is a network policy as the tools take it.
type NetworkInput struct {
	Mode  string   `json:"mode" jsonschema:"none: no network at all; public: the internet, but never the forkd host, other sandboxes or private, CGNAT, loopback, link-local and multicast ranges; allow: only what allow lists"`
	Allow []string `json:"allow,omitempty" jsonschema:"with mode allow: what the sandbox may reach: networks (198.51.100.0/24, 203.0.113.7, 203.0.113.7:443/tcp, ports as 8000-8099) and domain names (example.com, or *.example.com for every name below it)"`
}

// NetworkInfo is a sandbox's network policy as the tools report it.
type NetworkInfo struct {
	Mode  string   `json:"mode" jsonschema:"none, public or allow"`
	Allow []string `json:"allow,omitempty" jsonschema:"with mode allow: the networks and domain names the sandbox may reach"`
}

// networkPolicy checks a tool's network argument; nil stays nil (the
// snapshot's policy, else the daemon's default). The daemon checks the
// entries themselves.
func networkPolicy(in *NetworkInput) (*apiv1.NetworkPolicy, error) {
	if in == nil {
		return nil, nil
	}
	if !slices.Contains(networkModes, in.Mode) {
		return nil, invalid("network.mode %q: want none, public or allow", in.Mode)
	}
	var allow []string
	for _, e := range in.Allow {
		if e = strings.TrimSpace(e); e == "" {
			return nil, invalid("network.allow has an empty entry: give networks (198.51.100.0/24, 203.0.113.7:443/tcp) or domain names (example.com, *.example.com)")
		}
		allow = append(allow, e)
	}
	switch {
	case in.Mode != "allow" && len(allow) > 0:
		return nil, invalid("network.mode %q takes no allow list: use mode allow to list what the sandbox may reach", in.Mode)
	case in.Mode == "allow" && len(allow) == 0:
		return nil, invalid("network.mode allow with an empty allow list reaches nothing: list networks or domain names in network.allow, or use mode none")
	}
	return &apiv1.NetworkPolicy{Mode: in.Mode, Allow: allow}, nil
}

// networkInfo is s's policy for the tools' output (nil when the daemon
// reports none).
func networkInfo(s apiv1.Sandbox) *NetworkInfo {
	if s.Network == nil || s.Network.Policy.Mode == "" {
		return nil
	}
	return &NetworkInfo{Mode: s.Network.Policy.Mode, Allow: s.Network.Policy.Allow}
}

// describeNetwork says what a sandbox may reach, for result text.
func describeNetwork(n *NetworkInfo) string {
	switch {
	case n == nil:
		return ""
	case n.Mode == "allow":
		return "network: only " + strings.Join(n.Allow, ", ")
	case n.Mode == "public":
		return "network: public internet"
	case n.Mode == "none":
		return "network: none"
	}
	return "network: " + n.Mode
}

// networkSchema refines the schema of a network argument: its mode an
// enum, its fields never null.
func networkSchema(s *jsonschema.Schema) {
	s.Description = "what the sandbox may reach; leave it out for the snapshot's policy, else the daemon's default"
	for _, p := range s.Properties {
		if len(p.Types) == 2 && p.Types[0] == "null" {
			p.Type, p.Types = p.Types[1], nil
		}
	}
	enum(s.Properties["mode"], "", networkModes...)
}

// ---- expose_port ----

// ExposePortInput is expose_port's arguments.
type ExposePortInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox whose server to reach"`
	Port      int    `json:"port" jsonschema:"TCP port the server listens on inside the sandbox (it must listen on 0.0.0.0, not 127.0.0.1)"`
}

// ExposePortOutput says where a sandbox's port is served.
type ExposePortOutput struct {
	Port   int    `json:"port"`
	Path   string `json:"path" jsonschema:"the port's path on the forkd API: HTTP and WebSocket requests under it are proxied to the server, the rest of the path passed on"`
	URL    string `json:"url,omitempty" jsonschema:"absolute URL of the port (absent when this server does not know the API's address: use path on the API's base URL)"`
	Host   string `json:"host,omitempty" jsonschema:"PORT-ID.DOMAIN when the daemon routes a domain to sandbox ports: requests to this host reach the server with their whole path"`
	Socket string `json:"socket,omitempty" jsonschema:"the daemon's Unix socket when url is reachable only through it (curl --unix-socket SOCKET URL)"`
}

func (t *tools) exposePort(ctx context.Context, _ *mcp.CallToolRequest, in ExposePortInput) (*mcp.CallToolResult, ExposePortOutput, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, ExposePortOutput{}, err
	}
	if in.Port < 1 || in.Port > 65535 {
		return nil, ExposePortOutput{}, invalid("port %d: want 1 to 65535", in.Port)
	}
	p, err := t.b.Port(ctx, in.SandboxID, in.Port)
	if err != nil {
		return nil, ExposePortOutput{}, toolError(err)
	}
	out := ExposePortOutput{Port: p.Port, Path: p.Path, Host: p.Host}
	if out.Port == 0 {
		out.Port = in.Port
	}
	base := strings.TrimSuffix(t.opts.BaseURL, "/")
	var b strings.Builder
	switch {
	case p.Host != "":
		scheme := "http"
		if strings.HasPrefix(base, "https:") {
			scheme = "https"
		}
		out.URL = scheme + "://" + p.Host + "/"
		fmt.Fprintf(&b, "Port %d of sandbox %s is served at %s (any path under it reaches the server), and at the path %s on the forkd API.", out.Port, in.SandboxID, out.URL, p.Path)
	case base != "":
		out.URL = base + p.Path
		fmt.Fprintf(&b, "Port %d of sandbox %s is served at %s (append the app's path).", out.Port, in.SandboxID, out.URL)
	case t.opts.Socket != "":
		out.URL = "http://forkd" + p.Path
		out.Socket = t.opts.Socket
		fmt.Fprintf(&b, "Port %d of sandbox %s is served at %s through the daemon's Unix socket only: curl --unix-socket %s %s (append the app's path); `forkd port-forward %s %d` gives a local TCP port.",
			out.Port, in.SandboxID, out.URL, out.Socket, out.URL, in.SandboxID, out.Port)
	default:
		fmt.Fprintf(&b, "Port %d of sandbox %s is served at the path %s of the forkd API this MCP server belongs to (append the app's path).", out.Port, in.SandboxID, p.Path)
	}
	b.WriteString("\nHTTP and WebSocket requests are proxied to the server; they need the forkd API's credentials (a TCP daemon's bearer token, which the app never sees). " +
		"The server must listen on 0.0.0.0 in the sandbox; until it listens, requests answer 503. The sandbox's network policy does not apply to this inbound path.")
	return &mcp.CallToolResult{Content: text(b.String())}, out, nil
}

func addNetworkTools(s *mcp.Server, t *tools) {
	mcp.AddTool(s, &mcp.Tool{
		Name:  "expose_port",
		Title: "Expose a sandbox port",
		Description: "Get the URL at which a server listening on a TCP port inside a sandbox (a web app, an API, a notebook) " +
			"is reached through forkd's proxy (HTTP and WebSocket). Start the server first, e.g. with run_command " +
			"(background it: python3 -m http.server 8000 --bind 0.0.0.0 >/tmp/srv.log 2>&1 &).",
		InputSchema: schema[ExposePortInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id")
			bounds(p["port"], 1, 65535, 0)
		}),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, t.exposePort)
}
