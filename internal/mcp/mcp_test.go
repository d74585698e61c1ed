package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// fakeBackend records calls and answers with what a test set.
type fakeBackend struct {
	mu    sync.Mutex
	calls []string

	fork      func(apiv1.ForkRequest) (apiv1.ForkResponse, error)
	exec      func(id string, req apiv1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExecEvent, error)
	runCode   func(id string, req apiv1.RunCodeRequest) (apiv1.RunCodeResult, error)
	readFile  func(id, path string, w io.Writer) (int64, error)
	writeFile func(id, path string, mode uint32, data []byte) (apiv1.FileInfo, error)
	mkdir     func(id string, req apiv1.MkdirRequest) (apiv1.FileInfo, error)
	err       error // answered by every method without a func
}

func (f *fakeBackend) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeBackend) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeBackend) Fork(_ context.Context, req apiv1.ForkRequest) (apiv1.ForkResponse, error) {
	f.record("Fork %s %d", req.Tag, req.Count)
	if f.fork != nil {
		return f.fork(req)
	}
	return apiv1.ForkResponse{}, f.err
}

func (f *fakeBackend) Sandboxes(_ context.Context, tag, state string, labels ...string) ([]apiv1.Sandbox, error) {
	f.record("Sandboxes %s %s %v", tag, state, labels)
	return nil, f.err
}

func (f *fakeBackend) Kill(_ context.Context, ids []string, all bool) ([]string, error) {
	f.record("Kill %v %v", ids, all)
	if f.err != nil {
		return nil, f.err
	}
	return ids, nil
}

func (f *fakeBackend) Exec(_ context.Context, id string, req apiv1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExecEvent, error) {
	f.record("Exec %s", id)
	if f.exec != nil {
		return f.exec(id, req, stdin, stdout, stderr)
	}
	return apiv1.ExecEvent{}, f.err
}

func (f *fakeBackend) RunCode(_ context.Context, id string, req apiv1.RunCodeRequest) (apiv1.RunCodeResult, error) {
	f.record("RunCode %s", id)
	if f.runCode != nil {
		return f.runCode(id, req)
	}
	return apiv1.RunCodeResult{}, f.err
}

func (f *fakeBackend) ReadFile(_ context.Context, id, path string, w io.Writer) (int64, error) {
	f.record("ReadFile %s %s", id, path)
	if f.readFile != nil {
		return f.readFile(id, path, w)
	}
	return 0, f.err
}

func (f *fakeBackend) WriteFile(_ context.Context, id, path string, mode uint32, r io.Reader) (apiv1.FileInfo, error) {
	f.record("WriteFile %s %s %o", id, path, mode)
	data, _ := io.ReadAll(r)
	if f.writeFile != nil {
		return f.writeFile(id, path, mode, data)
	}
	return apiv1.FileInfo{}, f.err
}

func (f *fakeBackend) ListFiles(_ context.Context, id, path string) ([]apiv1.FileInfo, error) {
	f.record("ListFiles %s %s", id, path)
	return nil, f.err
}

func (f *fakeBackend) Mkdir(_ context.Context, id string, req apiv1.MkdirRequest) (apiv1.FileInfo, error) {
	f.record("Mkdir %s %s %v", id, req.Path, req.Parents)
	if f.mkdir != nil {
		return f.mkdir(id, req)
	}
	return apiv1.FileInfo{}, f.err
}

func (f *fakeBackend) Branch(_ context.Context, id string, req apiv1.BranchRequest) (apiv1.BranchResponse, error) {
	f.record("Branch %s %s %s", id, req.Tag, req.Mode)
	return apiv1.BranchResponse{}, f.err
}

func (f *fakeBackend) Snapshots(context.Context) ([]apiv1.Snapshot, error) {
	f.record("Snapshots")
	return nil, f.err
}

// connect serves b's tools on an in-memory transport and returns a client
// session of the SDK's client.
func connect(t *testing.T, b Backend) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := NewServer(b, Options{Version: "test"}).Connect(ctx, st, nil)
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

// call calls a tool; a protocol error fails the test.
func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v", name, err)
	}
	return res
}

// textOf joins a result's text content.
func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// structured decodes a result's structured content into v.
func structured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("structured content %s: %v", data, err)
	}
}

func mustOK(t *testing.T, name string, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, textOf(res))
	}
}

var allTools = []string{
	"branch_sandbox", "create_sandbox", "expose_port", "fork_sandboxes", "kill_sandbox", "list_files", "list_sandboxes",
	"list_snapshots", "read_file", "run_code", "run_command", "write_file",
}

type schemaDoc struct {
	Type                 any                   `json:"type"`
	Description          string                `json:"description"`
	Required             []string              `json:"required"`
	Properties           map[string]*schemaDoc `json:"properties"`
	Enum                 []any                 `json:"enum"`
	Default              json.RawMessage       `json:"default"`
	Minimum              *float64              `json:"minimum"`
	Maximum              *float64              `json:"maximum"`
	AdditionalProperties any                   `json:"additionalProperties"`
	Items                *schemaDoc            `json:"items"`
}

func TestToolsAndSchemas(t *testing.T) {
	cs := connect(t, &fakeBackend{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	var names []string
	for _, tool := range res.Tools {
		tools[tool.Name] = tool
		names = append(names, tool.Name)
	}
	sort.Strings(names)
	if !slices.Equal(names, allTools) {
		t.Fatalf("tools %v, want %v", names, allTools)
	}
	schemas := map[string]schemaDoc{}
	for _, tool := range res.Tools {
		if len(tool.Description) < 60 || tool.Title == "" || tool.Annotations == nil {
			t.Errorf("%s: description %q, title %q, annotations %v: describe it for a model", tool.Name, tool.Description, tool.Title, tool.Annotations)
		}
		var in, out schemaDoc
		for _, s := range []struct {
			v   any
			dst *schemaDoc
		}{{tool.InputSchema, &in}, {tool.OutputSchema, &out}} {
			data, _ := json.Marshal(s.v)
			if err := json.Unmarshal(data, s.dst); err != nil {
				t.Fatalf("%s: schema %s: %v", tool.Name, data, err)
			}
		}
		if in.Type != "object" || in.AdditionalProperties != false {
			t.Errorf("%s: input schema type %q, additionalProperties %v: want a closed object", tool.Name, in.Type, in.AdditionalProperties)
		}
		for name, p := range in.Properties {
			if p.Description == "" {
				t.Errorf("%s: argument %s has no description", tool.Name, name)
			}
		}
		if out.Type != "object" || len(out.Properties) == 0 {
			t.Errorf("%s: no structured output schema", tool.Name)
		}
		schemas[tool.Name] = in
	}

	// Spot checks of what a model relies on.
	want := map[string][]string{
		"create_sandbox": {"tag"}, "fork_sandboxes": {"tag", "n"}, "run_command": {"sandbox_id"},
		"run_code": {"sandbox_id", "code"}, "read_file": {"sandbox_id", "path"},
		"write_file": {"sandbox_id", "path", "content"}, "list_files": {"sandbox_id", "path"},
		"branch_sandbox": {"sandbox_id", "tag"},
	}
	for name, req := range want {
		if got := schemas[name].Required; !slices.Equal(got, req) {
			t.Errorf("%s: required %v, want %v", name, got, req)
		}
	}
	rc := schemas["run_command"].Properties
	if rc["argv"] == nil || rc["argv"].Items == nil || rc["argv"].Items.Type != "string" || rc["shell"] == nil ||
		!strings.Contains(rc["argv"].Description, "without a shell") {
		t.Errorf("run_command argv/shell: %+v %+v", rc["argv"], rc["shell"])
	}
	if m := rc["timeout_seconds"]; m == nil || m.Minimum == nil || *m.Minimum != 1 || m.Maximum == nil || string(m.Default) != "60" {
		t.Errorf("run_command timeout_seconds: %+v", m)
	}
	if e := schemas["branch_sandbox"].Properties["mode"].Enum; !slices.Equal(e, []any{"diff", "full", "live"}) {
		t.Errorf("branch_sandbox mode enum %v", e)
	}
	if e := schemas["read_file"].Properties["encoding"].Enum; !slices.Equal(e, []any{"auto", "text", "base64"}) {
		t.Errorf("read_file encoding enum %v", e)
	}
	if d := schemas["create_sandbox"].Properties["timeout_seconds"].Default; string(d) != "3600" {
		t.Errorf("create_sandbox timeout default %s", d)
	}
	if !slices.Equal(schemas["kill_sandbox"].Required, nil) || schemas["kill_sandbox"].Properties["sandbox_ids"] == nil {
		t.Errorf("kill_sandbox schema %+v", schemas["kill_sandbox"])
	}
}

func TestArgumentValidation(t *testing.T) {
	b := &fakeBackend{err: fmt.Errorf("backend must not be called")}
	cs := connect(t, b)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"create_sandbox", map[string]any{}, `missing properties: ["tag"]`},
		{"create_sandbox", map[string]any{"tag": ""}, "minLength"},
		{"create_sandbox", map[string]any{"tag": "x", "timeout_seconds": -5}, "minimum"},
		{"create_sandbox", map[string]any{"tag": "x", "metadata": map[string]any{"k": 1}}, "metadata"},
		{"fork_sandboxes", map[string]any{"tag": "x", "n": 0}, "minimum"},
		{"fork_sandboxes", map[string]any{"tag": "x", "n": "two"}, "n"},
		{"run_command", map[string]any{"shell": "ls"}, `missing properties: ["sandbox_id"]`},
		{"run_command", map[string]any{"sandbox_id": "sb-1"}, "nothing to run"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "argv": []string{"ls"}, "shell": "ls"}, "not both"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "argv": "ls -l"}, "argv"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "argv": []string{}}, "minItems"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "argv": []string{""}}, "argv[0] is empty"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "shell": "ls", "cwd": "tmp"}, "absolute"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "shell": "ls", "timeout_seconds": 99999}, "maximum"},
		{"run_command", map[string]any{"sandbox_id": "sb-1", "shell": "ls", "command": "ls"}, "additional properties"},
		{"run_code", map[string]any{"sandbox_id": "sb-1", "code": "   "}, "code is empty"},
		{"read_file", map[string]any{"sandbox_id": "sb-1", "path": "etc/passwd"}, "relative"},
		{"read_file", map[string]any{"sandbox_id": "sb-1", "path": "/etc/passwd", "encoding": "hex"}, "encoding"},
		{"read_file", map[string]any{"sandbox_id": "sb-1", "path": "/x", "max_bytes": 1 << 30}, "maximum"},
		{"write_file", map[string]any{"sandbox_id": "sb-1", "path": "/x"}, `missing properties: ["content"]`},
		{"write_file", map[string]any{"sandbox_id": "sb-1", "path": "/x", "content": "", "mode": "rwx"}, "mode"},
		{"write_file", map[string]any{"sandbox_id": "sb-1", "path": "/x", "content": "!!", "encoding": "base64"}, "not valid base64"},
		{"list_files", map[string]any{"sandbox_id": "sb-1", "path": ""}, "minLength"},
		{"branch_sandbox", map[string]any{"sandbox_id": "sb-1", "tag": "t", "mode": "incremental"}, "mode"},
		{"list_sandboxes", map[string]any{"state": "zombie"}, "state"},
		{"kill_sandbox", map[string]any{}, "give sandbox_id"},
		{"kill_sandbox", map[string]any{"sandbox_ids": []string{"sb-1", " "}}, "sandbox_id is empty"},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(textOf(res), tc.want) {
			t.Errorf("%s %v: isError %v, %q; want an error containing %q", tc.tool, tc.args, res.IsError, textOf(res), tc.want)
		}
	}
	if calls := b.Calls(); len(calls) != 0 {
		t.Errorf("invalid arguments reached the backend: %v", calls)
	}
	// An unknown tool is a protocol error, not a tool result.
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "format_disk"}); err == nil {
		t.Error("unknown tool: no error")
	}
}

func TestDaemonErrorsAreToolResults(t *testing.T) {
	notFound := &client.Error{Problem: apiv1.Problem{Status: 404, Code: "not_found", Detail: `no sandbox "sb-gone"`}}
	cs := connect(t, &fakeBackend{err: notFound})
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"run_command", map[string]any{"sandbox_id": "sb-gone", "argv": []string{"true"}}},
		{"run_code", map[string]any{"sandbox_id": "sb-gone", "code": "1"}},
		{"read_file", map[string]any{"sandbox_id": "sb-gone", "path": "/x"}},
		{"write_file", map[string]any{"sandbox_id": "sb-gone", "path": "/x", "content": "", "make_parents": false}},
		{"list_files", map[string]any{"sandbox_id": "sb-gone", "path": "/"}},
		{"branch_sandbox", map[string]any{"sandbox_id": "sb-gone", "tag": "t"}},
		{"kill_sandbox", map[string]any{"sandbox_id": "sb-gone"}},
		{"create_sandbox", map[string]any{"tag": "gone"}},
		{"list_snapshots", map[string]any{}},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || textOf(res) != `no sandbox "sb-gone" (not_found)` {
			t.Errorf("%s: isError %v, %q", tc.tool, res.IsError, textOf(res))
		}
	}

	// A command that cannot start is the daemon's failed_precondition.
	cs = connect(t, &fakeBackend{err: &client.Error{Problem: apiv1.Problem{Code: "failed_precondition", Detail: "exec /nope: no such file"}}})
	res := call(t, cs, "run_command", map[string]any{"sandbox_id": "sb-1", "argv": []string{"/nope"}})
	if !res.IsError || !strings.Contains(textOf(res), "exec /nope: no such file (failed_precondition)") {
		t.Errorf("start failure: %v %q", res.IsError, textOf(res))
	}
}

func TestRunCommand(t *testing.T) {
	var got apiv1.ExecRequest
	var gotStdin string
	b := &fakeBackend{exec: func(id string, req apiv1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExecEvent, error) {
		got = req
		if stdin != nil {
			data, _ := io.ReadAll(stdin)
			gotStdin = string(data)
		}
		io.WriteString(stdout, "out\n")
		io.WriteString(stderr, "warning: x\n")
		return apiv1.ExecEvent{Type: "exit", ExitCode: 3, DurationMicros: 1500}, nil
	}}
	cs := connect(t, b)
	res := call(t, cs, "run_command", map[string]any{
		"sandbox_id": "sb-1", "argv": []string{"sh", "-c", "echo $HOME; exit 3"}, "env": map[string]string{"A": "1"}, "cwd": "/tmp", "stdin": "in",
	})
	mustOK(t, "run_command", res) // a non-zero exit is a result, not a tool error
	if !slices.Equal(got.Argv, []string{"sh", "-c", "echo $HOME; exit 3"}) || got.Shell != "" || got.Env["A"] != "1" ||
		got.Cwd != "/tmp" || got.TimeoutMillis != 60_000 || !got.Stdin || gotStdin != "in" {
		t.Errorf("exec request %+v, stdin %q", got, gotStdin)
	}
	txt := textOf(res)
	for _, s := range []string{"Exited with code 3 (failure)", "stdout:\nout\n", "stderr:\nwarning: x"} {
		if !strings.Contains(txt, s) {
			t.Errorf("text lacks %q:\n%s", s, txt)
		}
	}
	var out CommandOutput
	structured(t, res, &out)
	if out.ExitCode != 3 || out.Stdout != "out\n" || out.Stderr != "warning: x\n" || out.DurationMillis != 1.5 {
		t.Errorf("structured %+v", out)
	}

	res = call(t, cs, "run_command", map[string]any{"sandbox_id": "sb-1", "shell": "ls | wc -l", "timeout_seconds": 5})
	mustOK(t, "run_command shell", res)
	if got.Shell != "ls | wc -l" || got.Argv != nil || got.TimeoutMillis != 5000 || got.Stdin {
		t.Errorf("shell exec request %+v", got)
	}
}

func TestCapBuffer(t *testing.T) {
	b := newCapBuffer(8)
	io.WriteString(b, "abc")
	if b.String() != "abc" || b.truncated {
		t.Fatalf("%q %v", b.String(), b.truncated)
	}
	io.WriteString(b, "defgh")
	if b.String() != "abcdefgh" || b.truncated {
		t.Fatalf("%q %v", b.String(), b.truncated)
	}
	for range 100 {
		io.WriteString(b, "0123456789")
	}
	if s := b.String(); !b.truncated || !strings.HasPrefix(s, "abcd") || !strings.HasSuffix(s, "6789") || !strings.Contains(s, "cut") {
		t.Fatalf("%q %v", s, b.truncated)
	}
}

// png is a 1x1 PNG.
var png = func() []byte {
	b, _ := base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
	return b
}()

func TestRunCodeImages(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString(png)
	cs := connect(t, &fakeBackend{runCode: func(id string, req apiv1.RunCodeRequest) (apiv1.RunCodeResult, error) {
		if req.TimeoutMillis != 60_000 {
			t.Errorf("timeout %d", req.TimeoutMillis)
		}
		return apiv1.RunCodeResult{
			Stdout:  "hi\n",
			Result:  map[string]string{"text/plain": "<Img>", "image/png": b64},
			Display: []map[string]string{{"text/plain": "<Figure size 640x480 with 1 Axes>", "image/png": b64}, {"text/plain": "x", "text/html": "<b>x</b>"}},
			Error:   &apiv1.CodeError{Name: "ValueError", Value: "late", Traceback: "Traceback ...\nValueError: late"},
		}, nil
	}})
	res := call(t, cs, "run_code", map[string]any{"sandbox_id": "sb-1", "code": "plot()"})
	mustOK(t, "run_code", res) // an exception is the code's outcome, not a tool failure
	var images []*mcp.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			images = append(images, ic)
		}
	}
	if len(images) != 2 || images[0].MIMEType != "image/png" || !bytes.Equal(images[0].Data, png) || !bytes.Equal(images[1].Data, png) {
		t.Fatalf("images %v", images)
	}
	txt := textOf(res)
	for _, s := range []string{"Raised ValueError: late", "stdout:\nhi", "result (text/plain):\n<Img>", "image #1", "display[1] (text/plain):\nx", "traceback:\nTraceback"} {
		if !strings.Contains(txt, s) {
			t.Errorf("text lacks %q:\n%s", s, txt)
		}
	}
	if strings.Contains(txt, "<Figure") {
		t.Errorf("a figure's repr is shown besides its image:\n%s", txt)
	}
	var out CodeOutput
	structured(t, res, &out)
	if out.Result["text/plain"] != "<Img>" || out.Result["image/png"] != "" || len(out.Display) != 2 ||
		out.Display[1]["text/html"] != "<b>x</b>" || !slices.Equal(out.Images, []string{"image/png", "image/png"}) || out.Error == nil {
		t.Errorf("structured %+v", out)
	}
}

func TestReadFile(t *testing.T) {
	files := map[string][]byte{"/t.txt": []byte("héllo\n"), "/p.png": png, "/b.bin": {0, 1, 2, 0xff}, "/big": bytes.Repeat([]byte("x"), 100)}
	cs := connect(t, &fakeBackend{readFile: func(id, path string, w io.Writer) (int64, error) {
		n, err := w.Write(files[path])
		return int64(n), err
	}})
	res := call(t, cs, "read_file", map[string]any{"sandbox_id": "sb-1", "path": "/t.txt"})
	var out ReadOutput
	structured(t, res, &out)
	if textOf(res) != "héllo\n" || out.Encoding != "text" || out.Content != "héllo\n" || out.Size != 7 {
		t.Errorf("text: %q %+v", textOf(res), out)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sb-1", "path": "/p.png"})
	if len(res.Content) != 2 || res.Content[1].(*mcp.ImageContent).MIMEType != "image/png" {
		t.Errorf("png: %v", res.Content)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sb-1", "path": "/b.bin"})
	structured(t, res, &out)
	if out.Encoding != "base64" || out.Content != "AAEC/w==" {
		t.Errorf("binary: %+v", out)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sb-1", "path": "/p.png", "encoding": "base64"})
	structured(t, res, &out)
	if out.Encoding != "base64" || out.Content != base64.StdEncoding.EncodeToString(png) {
		t.Errorf("png as base64: %+v", out)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sb-1", "path": "/big", "max_bytes": 10})
	structured(t, res, &out)
	if !out.Truncated || out.Content != "xxxxxxxxxx" || !strings.Contains(textOf(res), "truncated") {
		t.Errorf("truncated: %q %+v", textOf(res), out)
	}
}

func TestWriteFile(t *testing.T) {
	written := map[string][]byte{}
	dirs := map[string]bool{"/": true}
	b := &fakeBackend{
		writeFile: func(id, path string, mode uint32, data []byte) (apiv1.FileInfo, error) {
			dir := path[:strings.LastIndex(path, "/")]
			if dir == "" {
				dir = "/"
			}
			if !dirs[dir] {
				return apiv1.FileInfo{}, fmt.Errorf("no directory %s: %w", dir, errdefs.ErrNotFound)
			}
			written[path] = data
			return apiv1.FileInfo{Name: path[strings.LastIndex(path, "/")+1:], Path: path, Size: int64(len(data)), Mode: mode}, nil
		},
		mkdir: func(id string, req apiv1.MkdirRequest) (apiv1.FileInfo, error) {
			dirs[req.Path] = true
			return apiv1.FileInfo{Path: req.Path, IsDir: true}, nil
		},
	}
	cs := connect(t, b)
	res := call(t, cs, "write_file", map[string]any{"sandbox_id": "sb-1", "path": "/a/b/run.sh", "content": "#!/bin/sh\n", "mode": "0755"})
	mustOK(t, "write_file", res)
	var fe FileEntry
	structured(t, res, &fe)
	if string(written["/a/b/run.sh"]) != "#!/bin/sh\n" || fe.Mode != "0755" || fe.Size != 10 {
		t.Errorf("written %q, entry %+v", written, fe)
	}
	if calls := b.Calls(); !slices.Equal(calls, []string{"WriteFile sb-1 /a/b/run.sh 755", "Mkdir sb-1 /a/b true", "WriteFile sb-1 /a/b/run.sh 755"}) {
		t.Errorf("calls %v", calls)
	}
	res = call(t, cs, "write_file", map[string]any{"sandbox_id": "sb-1", "path": "/bin.dat", "content": "AAEC", "encoding": "base64"})
	mustOK(t, "write_file base64", res)
	if !bytes.Equal(written["/bin.dat"], []byte{0, 1, 2}) {
		t.Errorf("base64 write %v", written["/bin.dat"])
	}
	res = call(t, cs, "write_file", map[string]any{"sandbox_id": "sb-1", "path": "/c/d", "content": "", "make_parents": false})
	if !res.IsError || !strings.Contains(textOf(res), "no directory /c") {
		t.Errorf("make_parents=false: %v %q", res.IsError, textOf(res))
	}
}

func TestCreateDefaults(t *testing.T) {
	var got []apiv1.ForkRequest
	now := time.Now()
	cs := connect(t, &fakeBackend{fork: func(req apiv1.ForkRequest) (apiv1.ForkResponse, error) {
		got = append(got, req)
		var resp apiv1.ForkResponse
		for i := range req.Count {
			resp.Sandboxes = append(resp.Sandboxes, apiv1.Sandbox{ID: fmt.Sprintf("sb-%d", i), Tag: req.Tag, State: "running", Created: now})
		}
		return resp, nil
	}})
	mustOK(t, "create", call(t, cs, "create_sandbox", map[string]any{"tag": "py", "metadata": map[string]string{"task": "t1"}}))
	mustOK(t, "create no limit", call(t, cs, "create_sandbox", map[string]any{"tag": "py", "timeout_seconds": 0}))
	res := call(t, cs, "fork_sandboxes", map[string]any{"tag": "py", "n": 3, "timeout_seconds": 60, "idle_timeout_seconds": 30})
	mustOK(t, "fork", res)
	var fo ForkOutput
	structured(t, res, &fo)
	secs := func(p *int64) int64 {
		if p == nil {
			return -1 // absent: the daemon's default, which the tools never leave to it
		}
		return *p
	}
	if len(got) != 3 || secs(got[0].TimeoutSeconds) != 3600 || got[0].Metadata["task"] != "t1" || got[0].Count != 1 ||
		secs(got[1].TimeoutSeconds) != 0 || got[2].Count != 3 || secs(got[2].TimeoutSeconds) != 60 || got[2].IdleTimeoutSeconds != 30 || len(fo.Sandboxes) != 3 {
		t.Errorf("fork requests %+v, output %+v", got, fo)
	}
}
