package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/client"
)

// The tests below call the tools against a real daemon, through the same
// client `forkd mcp` uses. scripts/sdk-test-env.sh starts one:
//
//	eval "$(scripts/sdk-test-env.sh start mcp)"
//	go test ./internal/mcp/
//	scripts/sdk-test-env.sh stop mcp

// liveDaemon returns a client of the test daemon and the snapshot tag named
// by env, or skips.
func liveDaemon(t *testing.T, env string) (*client.Client, string) {
	t.Helper()
	sock, tag := os.Getenv("FORKD_SOCKET"), os.Getenv(env)
	if sock == "" || tag == "" {
		t.Skipf("needs a daemon: set FORKD_SOCKET and %s (eval \"$(scripts/sdk-test-env.sh start mcp)\")", env)
	}
	c := client.New(sock)
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("FORKD_SOCKET=%s: %v", sock, err)
	}
	return c, tag
}

func randomSuffix() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// createLive creates a sandbox with the tool and kills it at cleanup.
func createLive(t *testing.T, c *client.Client, cs *mcp.ClientSession, tag string, md map[string]string) SandboxInfo {
	t.Helper()
	args := map[string]any{"tag": tag, "timeout_seconds": 600}
	if md != nil {
		args["metadata"] = md
	}
	res := call(t, cs, "create_sandbox", args)
	mustOK(t, "create_sandbox", res)
	var sb SandboxInfo
	structured(t, res, &sb)
	if !strings.HasPrefix(sb.ID, "sb-") || sb.Tag != tag || sb.State != "running" || sb.ExpiresAt == "" || !strings.Contains(textOf(res), sb.ID) {
		t.Fatalf("create_sandbox: %+v %q", sb, textOf(res))
	}
	t.Cleanup(func() { c.Kill(context.Background(), []string{sb.ID}, false) })
	return sb
}

func TestLiveSandboxTools(t *testing.T) {
	c, tag := liveDaemon(t, "FORKD_TEST_TAG")
	cs := connect(t, c)
	label := "mcp-go-" + randomSuffix()
	sb := createLive(t, c, cs, tag, map[string]string{"test": label})

	// argv is never given to a shell: "$HOME" and "a b" arrive as they are.
	res := call(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "argv": []string{"echo", "a b", "$HOME", "*"}})
	mustOK(t, "run_command argv", res)
	var out CommandOutput
	structured(t, res, &out)
	if out.ExitCode != 0 || out.Stdout != "a b $HOME *\n" {
		t.Errorf("argv: %+v", out)
	}
	// shell: a command line, with its exit code as a result.
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "shell": "echo $((6*7)); echo oops >&2; exit 3", "env": map[string]string{"X": "y"}})
	mustOK(t, "run_command shell", res)
	structured(t, res, &out)
	if out.ExitCode != 3 || out.Stdout != "42\n" || out.Stderr != "oops\n" || !strings.Contains(textOf(res), "Exited with code 3") {
		t.Errorf("shell: %+v %q", out, textOf(res))
	}
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "argv": []string{"sh", "-c", "cat; echo $X; pwd"}, "stdin": "from stdin\n", "env": map[string]string{"X": "y"}, "cwd": "/tmp"})
	mustOK(t, "run_command stdin", res)
	structured(t, res, &out)
	if out.Stdout != "from stdin\ny\n/tmp\n" {
		t.Errorf("stdin/env/cwd: %+v", out)
	}
	// A program that does not exist cannot start: a tool error.
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "argv": []string{"/no/such/program"}})
	if !res.IsError || !strings.Contains(textOf(res), "/no/such/program") {
		t.Errorf("missing program: %v %q", res.IsError, textOf(res))
	}

	// Files: write (creating parents), read, list.
	res = call(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/mcp/sub/hello.txt", "content": "hello from mcp\n"})
	mustOK(t, "write_file", res)
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/mcp/sub/hello.txt"})
	mustOK(t, "read_file", res)
	if textOf(res) != "hello from mcp\n" {
		t.Errorf("read_file: %q", textOf(res))
	}
	res = call(t, cs, "list_files", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/mcp/sub"})
	mustOK(t, "list_files", res)
	var lo ListOutput
	structured(t, res, &lo)
	if len(lo.Entries) != 1 || lo.Entries[0].Name != "hello.txt" || lo.Entries[0].Size != 15 || lo.Entries[0].Mode != "0644" {
		t.Errorf("list_files: %+v", lo)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/mcp/none"})
	if !res.IsError || !strings.Contains(textOf(res), "not_found") {
		t.Errorf("read of a missing file: %v %q", res.IsError, textOf(res))
	}

	res = call(t, cs, "list_sandboxes", map[string]any{"metadata": map[string]string{"test": label}})
	mustOK(t, "list_sandboxes", res)
	var ls ListSandboxesOutput
	structured(t, res, &ls)
	if len(ls.Sandboxes) != 1 || ls.Sandboxes[0].ID != sb.ID {
		t.Errorf("list_sandboxes by label: %+v", ls)
	}
	res = call(t, cs, "list_snapshots", map[string]any{})
	mustOK(t, "list_snapshots", res)
	if !strings.Contains(textOf(res), tag) {
		t.Errorf("list_snapshots lacks %s: %q", tag, textOf(res))
	}

	// Branch, then fork two sandboxes from the branch: they have the file.
	branch := "mcp-go-branch-" + randomSuffix()
	res = call(t, cs, "branch_sandbox", map[string]any{"sandbox_id": sb.ID, "tag": branch})
	mustOK(t, "branch_sandbox", res)
	t.Cleanup(func() { c.RemoveSnapshot(context.Background(), branch) })
	var bo BranchOutput
	structured(t, res, &bo)
	if bo.Tag != branch || bo.Mode != "diff" || bo.State != "ready" {
		t.Errorf("branch_sandbox: %+v", bo)
	}
	res = call(t, cs, "fork_sandboxes", map[string]any{"tag": branch, "n": 2, "timeout_seconds": 600})
	mustOK(t, "fork_sandboxes", res)
	var fo ForkOutput
	structured(t, res, &fo)
	var ids []string
	for _, s := range fo.Sandboxes {
		ids = append(ids, s.ID)
	}
	t.Cleanup(func() { c.Kill(context.Background(), ids, false) })
	if len(ids) != 2 {
		t.Fatalf("fork_sandboxes: %+v", fo)
	}
	for _, id := range ids {
		res = call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/tmp/mcp/sub/hello.txt"})
		if res.IsError || textOf(res) != "hello from mcp\n" {
			t.Errorf("fork of the branch %s: %v %q", id, res.IsError, textOf(res))
		}
	}

	// Kill: the forks at once, then the source; a second kill is an error.
	res = call(t, cs, "kill_sandbox", map[string]any{"sandbox_ids": ids})
	mustOK(t, "kill_sandbox ids", res)
	var ko KillOutput
	structured(t, res, &ko)
	if !sameIDs(ko.Killed, ids) {
		t.Errorf("killed %v, want %v", ko.Killed, ids)
	}
	res = call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": sb.ID})
	mustOK(t, "kill_sandbox", res)
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "argv": []string{"true"}})
	if !res.IsError {
		t.Errorf("run_command in a killed sandbox: %q", textOf(res))
	}
}

func sameIDs(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// pngCode makes a 2x2 PNG in pure Python (the test snapshot has no
// matplotlib) and shows it as a result and through display().
const pngCode = `import struct, zlib
def _png(w=2, h=2):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
class Img:
    def _repr_png_(self):
        return _png()
display(Img(), "shown")
Img()
`

func TestLiveRunCode(t *testing.T) {
	c, tag := liveDaemon(t, "FORKD_TEST_PY_TAG")
	cs := connect(t, c)
	sb := createLive(t, c, cs, tag, nil)

	res := call(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": "x = 21\nprint('half')\nx * 2"})
	mustOK(t, "run_code", res)
	var out CodeOutput
	structured(t, res, &out)
	if out.Stdout != "half\n" || out.Result["text/plain"] != "42" || out.Error != nil {
		t.Errorf("run_code: %+v", out)
	}
	// The session persists; an exception is a result that says so.
	res = call(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": "print(x)\nx / 0"})
	mustOK(t, "run_code exception", res)
	structured(t, res, &out)
	if out.Stdout != "21\n" || out.Error == nil || out.Error.Name != "ZeroDivisionError" || !strings.Contains(textOf(res), "Raised ZeroDivisionError") {
		t.Errorf("run_code exception: %+v %q", out, textOf(res))
	}
	res = call(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": "import time\ntime.sleep(30)", "timeout_seconds": 2})
	mustOK(t, "run_code timeout", res)
	structured(t, res, &out)
	if !out.TimedOut || !strings.Contains(textOf(res), "timeout") {
		t.Errorf("run_code timeout: %+v %q", out, textOf(res))
	}

	// Images: the result's image/png and display()'s, as image content.
	res = call(t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "code": pngCode})
	mustOK(t, "run_code images", res)
	structured(t, res, &out)
	var images []*mcp.ImageContent
	for _, ct := range res.Content {
		if ic, ok := ct.(*mcp.ImageContent); ok {
			images = append(images, ic)
		}
	}
	if len(images) == 0 || images[0].MIMEType != "image/png" || !strings.HasPrefix(string(images[0].Data), "\x89PNG") {
		t.Fatalf("no PNG image content: %q %+v", textOf(res), out)
	}
	if len(out.Display) == 0 {
		t.Logf("the test snapshot's Python session sends no display outputs (older guest agent); result image checked only")
	} else if len(images) != 2 || len(out.Display) != 2 || out.Display[1]["text/plain"] != "'shown'" {
		t.Errorf("display: %d images, %+v", len(images), out)
	}
}

// TestLiveCancel checks that a tool call's context reaches the daemon: a
// client that gives up does not leave the command running to its timeout.
func TestLiveCancel(t *testing.T) {
	c, tag := liveDaemon(t, "FORKD_TEST_TAG")
	cs := connect(t, c)
	sb := createLive(t, c, cs, tag, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox_id": sb.ID, "argv": []string{"sleep", "60"}}})
	if err == nil || time.Since(start) > 30*time.Second { // sleep 60 would take a minute
		t.Fatalf("cancelled call: %v after %v", err, time.Since(start))
	}
	// The sandbox still answers, and the process is gone (not left to run
	// for its minute).
	var out CommandOutput
	for deadline := time.Now().Add(time.Minute); ; {
		res := call(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "shell": "ps -o pid,args | grep '[s]leep 60' || true"})
		mustOK(t, "run_command after cancel", res)
		structured(t, res, &out)
		if out.Stdout == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out.Stdout != "" {
		t.Errorf("the cancelled command still runs: %q", out.Stdout)
	}
}
