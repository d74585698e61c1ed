package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Port makes fakeBackend a Backend; netBackend answers it for real.
func (f *fakeBackend) Port(_ context.Context, id string, port int) (apiv1.Port, error) {
	f.record("Port %s %d", id, port)
	return apiv1.Port{}, f.err
}

// netBackend is a fakeBackend whose Port answers with port.
type netBackend struct {
	*fakeBackend
	port func(id string, port int) (apiv1.Port, error)
}

func (n *netBackend) Port(ctx context.Context, id string, port int) (apiv1.Port, error) {
	n.record("Port %s %d", id, port)
	return n.port(id, port)
}

// connectWith is connect with server options of the test's own.
func connectWith(t *testing.T, b Backend, opts Options) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := NewServer(b, opts).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "forkd-test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// forkEcho answers a fork with count sandboxes carrying the request's
// policy (as the daemon reports it), and keeps the request.
func forkEcho(got *[]apiv1.ForkRequest) func(apiv1.ForkRequest) (apiv1.ForkResponse, error) {
	return func(req apiv1.ForkRequest) (apiv1.ForkResponse, error) {
		*got = append(*got, req)
		var resp apiv1.ForkResponse
		for i := range req.Count {
			sb := apiv1.Sandbox{ID: fmt.Sprintf("sb-%d", i+1), Tag: req.Tag, State: apiv1.StateRunning}
			if req.Network != nil {
				sb.Network = &apiv1.SandboxNetwork{Policy: *req.Network}
			}
			resp.Sandboxes = append(resp.Sandboxes, sb)
		}
		return resp, nil
	}
}

func TestNetworkArgument(t *testing.T) {
	var got []apiv1.ForkRequest
	b := &fakeBackend{}
	b.fork = forkEcho(&got)
	cs := connect(t, b)

	res := call(t, cs, "create_sandbox", map[string]any{
		"tag": "base", "network": map[string]any{"mode": "allow", "allow": []string{"198.51.100.0/24", " *.example.com "}},
	})
	mustOK(t, "create_sandbox", res)
	want := &apiv1.NetworkPolicy{Mode: "allow", Allow: []string{"198.51.100.0/24", "*.example.com"}}
	if len(got) != 1 || got[0].Network == nil || got[0].Network.Mode != want.Mode || !slices.Equal(got[0].Network.Allow, want.Allow) {
		t.Fatalf("fork request %+v, want network %+v", got, want)
	}
	var sb SandboxInfo
	structured(t, res, &sb)
	if sb.Network == nil || sb.Network.Mode != "allow" || !slices.Equal(sb.Network.Allow, want.Allow) {
		t.Errorf("create_sandbox network %+v", sb.Network)
	}
	if txt := textOf(res); !strings.Contains(txt, "network: only 198.51.100.0/24, *.example.com") {
		t.Errorf("create_sandbox text %q does not say the network", txt)
	}

	res = call(t, cs, "fork_sandboxes", map[string]any{"tag": "base", "n": 2, "network": map[string]any{"mode": "none"}})
	mustOK(t, "fork_sandboxes", res)
	if r := got[len(got)-1]; r.Count != 2 || r.Network == nil || r.Network.Mode != "none" || r.Network.Allow != nil {
		t.Fatalf("fork request %+v", r)
	}
	var fo ForkOutput
	structured(t, res, &fo)
	if len(fo.Sandboxes) != 2 || fo.Sandboxes[1].Network == nil || fo.Sandboxes[1].Network.Mode != "none" {
		t.Errorf("fork_sandboxes output %+v", fo)
	}
	if !strings.Contains(textOf(res), "network: none") {
		t.Errorf("fork_sandboxes text %q", textOf(res))
	}

	// No network argument: the snapshot's policy, else the daemon's.
	res = call(t, cs, "create_sandbox", map[string]any{"tag": "base"})
	mustOK(t, "create_sandbox", res)
	if r := got[len(got)-1]; r.Network != nil {
		t.Errorf("create_sandbox without network sent %+v", r.Network)
	}
	var plain SandboxInfo
	structured(t, res, &plain)
	if plain.Network != nil || strings.Contains(textOf(res), "network:") {
		t.Errorf("a sandbox the daemon reported no policy for: %+v, %q", plain.Network, textOf(res))
	}
}

func TestNetworkArgumentValidation(t *testing.T) {
	b := &fakeBackend{err: fmt.Errorf("backend must not be called")}
	cs := connect(t, b)
	for _, tc := range []struct {
		tool    string
		network any
		want    string
	}{
		{"create_sandbox", map[string]any{"mode": "internet"}, "mode"},
		{"create_sandbox", map[string]any{"allow": []string{"198.51.100.0/24"}}, `missing properties: ["mode"]`},
		{"create_sandbox", map[string]any{"mode": "none", "allow": []string{"198.51.100.0/24"}}, "takes no allow list"},
		{"create_sandbox", map[string]any{"mode": "public", "allow": []string{"example.com"}}, "takes no allow list"},
		{"create_sandbox", map[string]any{"mode": "allow"}, "empty allow list"},
		{"create_sandbox", map[string]any{"mode": "allow", "allow": []string{"example.com", " "}}, "empty entry"},
		{"create_sandbox", map[string]any{"mode": "allow", "allow": "example.com"}, "allow"},
		{"create_sandbox", "public", "network"},
		{"create_sandbox", map[string]any{"mode": "none", "deny": []string{"x"}}, "additional properties"},
		{"fork_sandboxes", map[string]any{"mode": "allow", "allow": []string{}}, "empty allow list"},
		{"fork_sandboxes", map[string]any{"mode": "open"}, "mode"},
	} {
		args := map[string]any{"tag": "base", "network": tc.network}
		if tc.tool == "fork_sandboxes" {
			args["n"] = 2
		}
		res := call(t, cs, tc.tool, args)
		if !res.IsError || !strings.Contains(textOf(res), tc.want) {
			t.Errorf("%s network %v: isError %v, %q; want an error containing %q", tc.tool, tc.network, res.IsError, textOf(res), tc.want)
		}
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"sandbox_id": "sb-1"}, `missing properties: ["port"]`},
		{map[string]any{"port": 8080}, `missing properties: ["sandbox_id"]`},
		{map[string]any{"sandbox_id": "", "port": 8080}, "minLength"},
		{map[string]any{"sandbox_id": "sb-1", "port": 0}, "minimum"},
		{map[string]any{"sandbox_id": "sb-1", "port": 65536}, "maximum"},
		{map[string]any{"sandbox_id": "sb-1", "port": "8080"}, "port"},
		{map[string]any{"sandbox_id": "sb-1", "port": 80.5}, "port"},
	} {
		res := call(t, cs, "expose_port", tc.args)
		if !res.IsError || !strings.Contains(textOf(res), tc.want) {
			t.Errorf("expose_port %v: isError %v, %q; want an error containing %q", tc.args, res.IsError, textOf(res), tc.want)
		}
	}
	if calls := b.Calls(); len(calls) != 0 {
		t.Errorf("invalid arguments reached the backend: %v", calls)
	}
}

func TestNetworkSchemas(t *testing.T) {
	cs := connect(t, &fakeBackend{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]schemaDoc{}
	for _, tool := range res.Tools {
		var in schemaDoc
		data, _ := json.Marshal(tool.InputSchema)
		if err := json.Unmarshal(data, &in); err != nil {
			t.Fatal(err)
		}
		schemas[tool.Name] = in
	}
	for _, name := range []string{"create_sandbox", "fork_sandboxes"} {
		n := schemas[name].Properties["network"]
		if n == nil || n.Type != "object" || n.Description == "" || !slices.Equal(n.Required, []string{"mode"}) {
			t.Fatalf("%s network schema %+v", name, n)
		}
		if m := n.Properties["mode"]; m == nil || !slices.Equal(m.Enum, []any{"none", "public", "allow"}) || m.Description == "" {
			t.Errorf("%s network.mode %+v", name, m)
		}
		if a := n.Properties["allow"]; a == nil || a.Type != "array" || a.Items == nil || a.Items.Type != "string" || !strings.Contains(a.Description, "198.51.100.0/24") {
			t.Errorf("%s network.allow %+v", name, a)
		}
		if slices.Contains(schemas[name].Required, "network") {
			t.Errorf("%s: network is required", name)
		}
	}
	ep := schemas["expose_port"]
	if !slices.Equal(ep.Required, []string{"sandbox_id", "port"}) {
		t.Errorf("expose_port required %v", ep.Required)
	}
	if p := ep.Properties["port"]; p == nil || p.Type != "integer" || p.Minimum == nil || *p.Minimum != 1 || p.Maximum == nil || *p.Maximum != 65535 {
		t.Errorf("expose_port port %+v", p)
	}
}

func TestExposePort(t *testing.T) {
	path := "/v1/sandboxes/sb-1/ports/8080/"
	for _, tc := range []struct {
		name    string
		opts    Options
		host    string
		url     string
		socket  string
		inText  []string
		outText []string
	}{
		{
			name: "in-process (/mcp): the path on the API", opts: Options{},
			inText: []string{"at the path " + path, "forkd API", "0.0.0.0", "503"}, outText: []string{"http://"},
		},
		{
			name: "Unix socket", opts: Options{Socket: "/run/forkd/forkd.sock"},
			url: "http://forkd" + path, socket: "/run/forkd/forkd.sock",
			inText: []string{"curl --unix-socket /run/forkd/forkd.sock http://forkd" + path, "forkd port-forward sb-1 8080"},
		},
		{
			name: "TCP daemon", opts: Options{BaseURL: "https://forkd.example:7443/"},
			url: "https://forkd.example:7443" + path, inText: []string{"https://forkd.example:7443" + path, "bearer token"},
		},
		{
			name: "port domain", opts: Options{BaseURL: "https://forkd.example:7443"}, host: "8080-sb-1.apps.example",
			url: "https://8080-sb-1.apps.example/", inText: []string{"https://8080-sb-1.apps.example/", path},
		},
		{
			name: "port domain on a socket", opts: Options{Socket: "/run/forkd/forkd.sock"}, host: "8080-sb-1.apps.example",
			url: "http://8080-sb-1.apps.example/",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &netBackend{fakeBackend: &fakeBackend{}, port: func(id string, port int) (apiv1.Port, error) {
				return apiv1.Port{Port: port, Path: fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", id, port), Host: tc.host}, nil
			}}
			cs := connectWith(t, b, tc.opts)
			res := call(t, cs, "expose_port", map[string]any{"sandbox_id": "sb-1", "port": 8080})
			mustOK(t, "expose_port", res)
			var out ExposePortOutput
			structured(t, res, &out)
			want := ExposePortOutput{Port: 8080, Path: path, URL: tc.url, Host: tc.host, Socket: tc.socket}
			if out != want {
				t.Errorf("expose_port %+v, want %+v", out, want)
			}
			txt := textOf(res)
			for _, s := range tc.inText {
				if !strings.Contains(txt, s) {
					t.Errorf("text %q lacks %q", txt, s)
				}
			}
			for _, s := range tc.outText {
				if strings.Contains(txt, s) {
					t.Errorf("text %q has %q", txt, s)
				}
			}
			if calls := b.Calls(); !slices.Equal(calls, []string{"Port sb-1 8080"}) {
				t.Errorf("calls %v", calls)
			}
		})
	}

	t.Run("no such sandbox", func(t *testing.T) {
		b := &fakeBackend{err: fmt.Errorf("sandbox sb-9 not found: %w", errdefs.ErrNotFound)}
		cs := connect(t, b)
		res := call(t, cs, "expose_port", map[string]any{"sandbox_id": "sb-9", "port": 8080})
		if !res.IsError || !strings.Contains(textOf(res), "sb-9 not found") || !strings.Contains(textOf(res), "(not_found)") {
			t.Errorf("isError %v, %q", res.IsError, textOf(res))
		}
	})
}
