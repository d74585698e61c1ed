package api

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// mcpServer is a Server with an engine (over an empty data dir with one
// snapshot, and a driver that starts nothing), tokens and an audit log.
func mcpServer(t *testing.T) (s *Server, token, auditDir string) {
	t.Helper()
	dataDir := t.TempDir()
	addSnapshot(t, dataDir, "base", 4096)
	e := nopEngine(t, dataDir, "fkmc", nil)
	tokens, token := tokenStore(t, "agent-ci")
	auditDir = filepath.Join(t.TempDir(), "audit")
	log, err := audit.Open(auditDir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	return &Server{Engine: e, Version: "test", Tokens: tokens, Audit: log}, token, auditDir
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func mcpConnect(t *testing.T, endpoint string, hc *http.Client) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "api-test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func toolCall(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// auditRecords returns the audit log's records by action.
func auditRecords(t *testing.T, dir string) map[string][]audit.Record {
	t.Helper()
	recs, err := audit.Tail(dir, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]audit.Record{}
	for _, r := range recs {
		out[r.Action] = append(out[r.Action], r)
	}
	return out
}

// TestMCPHTTPTokenAuthAndAudit drives /mcp over TCP with the Go SDK's
// streamable client: refused without a token; with one, tool calls are the
// REST requests they make, authorized by the same token and audited under
// its name, the route and the request id of the /mcp POST.
func TestMCPHTTPTokenAuthAndAudit(t *testing.T) {
	s, token, auditDir := mcpServer(t)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	endpoint := srv.URL + "/mcp"

	// No token: the MCP handshake fails with the API's 401.
	if _, err := mcpConnect(t, endpoint, srv.Client()); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Fatalf("connect without a token: %v, want a 401", err)
	}
	req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p apiv1.Problem
	json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != 401 || p.Code != "unauthenticated" || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("POST /mcp without a token: %d %+v", resp.StatusCode, p)
	}
	// A wrong token is refused too.
	if _, err := mcpConnect(t, endpoint, &http.Client{Transport: bearer{"forkd_wrong", srv.Client().Transport}}); err == nil {
		t.Fatal("connect with a wrong token succeeded")
	}

	hc := &http.Client{Transport: bearer{token, srv.Client().Transport}}
	cs, err := mcpConnect(t, endpoint, hc)
	if err != nil {
		t.Fatalf("connect with a token: %v", err)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 12 {
		t.Fatalf("tools/list: %v, %d tools", err, len(tools.Tools))
	}

	// A read: GET /v1/snapshots in-process.
	res := toolCall(t, cs, "list_snapshots", map[string]any{})
	if res.IsError || !strings.Contains(resultText(res), "base") {
		t.Fatalf("list_snapshots: %v %q", res.IsError, resultText(res))
	}
	// Writes that the API refuses: errors come back as tool results with
	// the daemon's message, and are audited as those routes.
	res = toolCall(t, cs, "create_sandbox", map[string]any{"tag": "not a tag!"})
	if !res.IsError || !strings.Contains(resultText(res), "invalid_argument") {
		t.Fatalf("create_sandbox with a bad tag: %v %q", res.IsError, resultText(res))
	}
	res = toolCall(t, cs, "kill_sandbox", map[string]any{"sandbox_id": "sb-nosuchbox"})
	if !res.IsError || !strings.Contains(resultText(res), "not_found") {
		t.Fatalf("kill_sandbox of a missing sandbox: %v %q", res.IsError, resultText(res))
	}
	res = toolCall(t, cs, "run_command", map[string]any{"sandbox_id": "sb-nosuchbox", "argv": []string{"true"}})
	if !res.IsError || !strings.Contains(resultText(res), "not_found") {
		t.Fatalf("run_command in a missing sandbox: %v %q", res.IsError, resultText(res))
	}

	// The record of a POST /mcp is written when its handler returns,
	// which can be just after the client has read the answer: wait for
	// the one carrying the last tool call.
	var recs map[string][]audit.Record
	mcpIDs := map[string]bool{}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		recs = auditRecords(t, auditDir)
		mcpIDs = map[string]bool{}
		for _, r := range recs["POST /mcp"] {
			mcpIDs[r.RequestID] = true
		}
		ex := recs["POST /v1/sandboxes/{id}/exec"]
		if (len(ex) > 0 && mcpIDs[ex[0].RequestID]) || time.Now().After(deadline) {
			break
		}
	}
	for _, r := range recs["POST /mcp"] {
		if r.Outcome == "unauthenticated" {
			continue // the test's own tokenless probe, audited before auth
		}
		if r.Token != "agent-ci" {
			t.Errorf("POST /mcp audited with token %q", r.Token)
		}
	}
	for action, outcome := range map[string]string{
		"POST /v1/sandboxes":           "invalid_argument",
		"POST /v1/sandboxes/kill":      "not_found",
		"POST /v1/sandboxes/{id}/exec": "not_found",
	} {
		rs := recs[action]
		if len(rs) != 1 {
			t.Errorf("%s: %d audit records, want 1 (%v)", action, len(rs), recs)
			continue
		}
		r := rs[0]
		if r.Token != "agent-ci" || r.Outcome != outcome || !mcpIDs[r.RequestID] || !strings.HasPrefix(r.Peer, "127.0.0.1:") {
			t.Errorf("%s audited as %+v; want token agent-ci, outcome %s, the request id of a POST /mcp (%v), a loopback peer", action, r, outcome, mcpIDs)
		}
		if action == "POST /v1/sandboxes/{id}/exec" && (len(r.Targets) != 1 || r.Targets[0] != "sb-nosuchbox") {
			t.Errorf("exec targets %v", r.Targets)
		}
	}
	// Reads are not audited, as in REST.
	if len(recs["GET /v1/snapshots"]) != 0 {
		t.Errorf("a read was audited: %v", recs["GET /v1/snapshots"])
	}

	// Revoking the token ends access at the next request.
	if err := s.Tokens.Revoke("agent-ci"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_snapshots", Arguments: map[string]any{}}); err == nil {
		t.Error("tool call after the token was revoked succeeded")
	}
}

// TestMCPHTTPErrorsAreProblems checks what /mcp answers besides JSON-RPC:
// 405 with Allow: POST for GET and DELETE (stateless, as the MCP spec asks)
// and any other method, and the SDK's
// plain-text refusals as problem+json like every API error.
func TestMCPHTTPErrorsAreProblems(t *testing.T) {
	s, token, _ := mcpServer(t)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	do := func(method, ct, accept, body string) (*http.Response, apiv1.Problem) {
		req, _ := http.NewRequest(method, srv.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p apiv1.Problem
		json.NewDecoder(resp.Body).Decode(&p)
		return resp, p
	}
	for _, m := range []string{http.MethodGet, http.MethodDelete, http.MethodPut, http.MethodPatch} {
		resp, p := do(m, "", "text/event-stream", "")
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || p.Status != 405 || p.Code != "invalid_argument" ||
			resp.Header.Get("Content-Type") != "application/problem+json" || p.RequestID == "" {
			t.Errorf("%s /mcp: %d %v %+v", m, resp.StatusCode, resp.Header, p)
		}
	}
	resp, p := do(http.MethodPost, "text/plain", "application/json, text/event-stream", "{}")
	if resp.StatusCode != 415 || p.Status != 415 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "Content-Type") ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("wrong content type: %d %+v", resp.StatusCode, p)
	}
	resp, p = do(http.MethodPost, "application/json", "application/json", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if resp.StatusCode != 400 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "Accept") {
		t.Errorf("wrong Accept: %d %+v", resp.StatusCode, p)
	}
}

// TestMCPUnixSocket serves the API on a Unix socket, as the daemon does: no
// token is needed there even with tokens configured, and tool calls are
// audited with the peer's uid and pid.
func TestMCPUnixSocket(t *testing.T) {
	s, _, auditDir := mcpServer(t)
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler(), ConnContext: PeerContext}
	go hs.Serve(ln)
	defer hs.Close()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	cs, err := mcpConnect(t, "http://forkd/mcp", hc)
	if err != nil {
		t.Fatalf("connect over the socket: %v", err)
	}
	res := toolCall(t, cs, "fork_sandboxes", map[string]any{"tag": "no such tag!", "n": 2})
	if !res.IsError {
		t.Fatalf("fork_sandboxes: %q", resultText(res))
	}
	res = toolCall(t, cs, "list_sandboxes", map[string]any{})
	if res.IsError || !strings.Contains(resultText(res), "0 sandboxes") {
		t.Fatalf("list_sandboxes: %q", resultText(res))
	}
	recs := auditRecords(t, auditDir)["POST /v1/sandboxes"]
	want := "unix:uid=" + strconv.Itoa(os.Getuid()) + ",pid=" + strconv.Itoa(os.Getpid())
	if len(recs) != 1 || recs[0].Peer != want || recs[0].Token != "" || recs[0].Outcome != "invalid_argument" {
		t.Errorf("audit %+v, want peer %s", recs, want)
	}
}

// TestMCPTransportNeedsACaller: the in-process transport serves only
// requests made on behalf of an /mcp request.
func TestMCPTransportNeedsACaller(t *testing.T) {
	s, _, _ := mcpServer(t)
	c := client.NewWithTransport("http://forkd", &mcpTransport{api: s.Handler})
	_, err := c.Sandboxes(context.Background(), "", "")
	if !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("no caller: %v", err)
	}
	// With a TCP caller but no Authorization header, the API's own auth
	// refuses it.
	ctx := context.WithValue(context.Background(), mcpCallerKey{}, mcpCaller{localAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, peer: "127.0.0.1:1"})
	if _, err := c.Sandboxes(ctx, "", ""); !errdefs.IsUnauthenticated(err) {
		t.Fatalf("caller without a token: %v", err)
	}
	// A Unix-socket caller passes, as on the socket.
	ctx = context.WithValue(context.Background(), mcpCallerKey{}, mcpCaller{localAddr: &net.UnixAddr{Name: "x", Net: "unix"}, peer: "unix:uid=0,pid=1"})
	if list, err := c.Sandboxes(ctx, "", ""); err != nil || len(list) != 0 {
		t.Fatalf("unix caller: %v %v", list, err)
	}
}

// TestMCPLiveDaemon drives the test daemon's /mcp on its socket (see
// scripts/sdk-test-env.sh; the daemon must be built with /mcp): real tool
// calls through the in-process transport, streamed exec included, audited
// with this process as the peer.
func TestMCPLiveDaemon(t *testing.T) {
	sock, tag := os.Getenv("FORKD_SOCKET"), os.Getenv("FORKD_TEST_TAG")
	if sock == "" || tag == "" {
		t.Skip(`needs a daemon: set FORKD_SOCKET and FORKD_TEST_TAG (eval "$(scripts/sdk-test-env.sh start mcp)")`)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	cs, err := mcpConnect(t, "http://forkd/mcp", hc)
	if err != nil {
		t.Fatalf("connect to %s/mcp: %v (a daemon built before /mcp existed?)", sock, err)
	}
	res := toolCall(t, cs, "create_sandbox", map[string]any{"tag": tag, "timeout_seconds": 300})
	if res.IsError {
		t.Fatalf("create_sandbox: %s", resultText(res))
	}
	var sb struct {
		ID string `json:"id"`
	}
	data, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(data, &sb)
	defer client.New(sock).Kill(context.Background(), []string{sb.ID}, false)

	res = toolCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "argv": []string{"sh", "-c", "tr a-z A-Z; seq 1 20000 | tail -n 1"}, "stdin": "piped\n"})
	if res.IsError || !strings.Contains(resultText(res), "PIPED\n20000") {
		t.Fatalf("run_command: %q", resultText(res))
	}
	res = toolCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/x/y.txt", "content": "via http"})
	if res.IsError {
		t.Fatalf("write_file: %q", resultText(res))
	}
	res = toolCall(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/x/y.txt"})
	if res.IsError || resultText(res) != "via http" {
		t.Fatalf("read_file: %q", resultText(res))
	}
	res = toolCall(t, cs, "kill_sandbox", map[string]any{"sandbox_id": sb.ID})
	if res.IsError {
		t.Fatalf("kill_sandbox: %q", resultText(res))
	}

	dir := os.Getenv("FORKD_DATA_DIR")
	if dir == "" {
		return
	}
	recs, err := audit.Tail(filepath.Join(dir, "audit"), 200)
	if err != nil {
		t.Fatal(err)
	}
	peer := "unix:uid=" + strconv.Itoa(os.Getuid()) + ",pid=" + strconv.Itoa(os.Getpid())
	found := map[string]bool{}
	for _, r := range recs {
		if r.Peer == peer && len(r.Targets) > 0 && r.Targets[0] == sb.ID {
			found[r.Action] = true
		}
	}
	for _, a := range []string{"POST /v1/sandboxes", "POST /v1/sandboxes/{id}/exec", "PUT /v1/sandboxes/{id}/files", "POST /v1/sandboxes/kill"} {
		if !found[a] {
			t.Errorf("no audit record %s for %s by %s", a, sb.ID, peer)
		}
	}
}
