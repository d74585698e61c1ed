package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// fakeDaemon serves the API routes the CLI tests call on a Unix socket,
// with canned answers, and records the requests it got.
type fakeDaemon struct {
	sock string
	mu   sync.Mutex
	reqs []*http.Request
}

func (d *fakeDaemon) requests() []*http.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*http.Request(nil), d.reqs...)
}

func newFakeDaemon(t *testing.T, mux *http.ServeMux) *fakeDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "forkd-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &fakeDaemon{sock: filepath.Join(dir, "api.sock")}
	ln, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}")) })
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.reqs = append(d.reqs, r)
		d.mu.Unlock()
		mux.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return d
}

func writeProblemJSON(w http.ResponseWriter, p apiv1.Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

// runCLI runs forkd with args against d (nil: none) and returns what it printed on
// stdout and the command's error. Not parallel: it swaps os.Stdout.
func runCLI(t *testing.T, d *fakeDaemon, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	outc := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		outc <- string(b)
	}()
	g := &globals{}
	root := newRootCmd(g)
	base := []string{"--no-autostart", "--host", ""}
	if d != nil {
		base = append(base, "--socket", d.sock)
	}
	root.SetArgs(append(base, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = execute(ctx, root)
	w.Close()
	return <-outc, err
}

func TestLsShowsFirstLineOfDeadReasonAndInfoShowsAll(t *testing.T) {
	sb := apiv1.Sandbox{
		ID: "sb-1", Tag: "t", State: apiv1.StateDead, Created: time.Now(), ReadyMillis: 12.5, PID: 42,
		DeadReason:  "VMM exited: exit status 1\nqemu: terminating on signal 9\nmore",
		Metadata:    map[string]string{"job": "a", "b": "c"},
		ConsoleTail: "[ 0.1] boot\n[ 0.2] panic\n",
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode([]apiv1.Sandbox{sb}) })
	mux.HandleFunc("GET /v1/sandboxes/sb-1", func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(sb) })
	d := newFakeDaemon(t, mux)

	out, err := runCLI(t, d, "ls")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "dead: VMM exited: exit status 1 …") || strings.Contains(out, "terminating") {
		t.Fatalf("ls: want a header and one row with the reason's first line:\n%s", out)
	}

	out, err = runCLI(t, d, "sandbox", "info", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"id:           sb-1\n",
		"dead reason:  VMM exited: exit status 1\n              qemu: terminating on signal 9\n              more\n",
		"labels:       b=c, job=a\n",
		"pid:          42\n",
		"expires:      never\n",
		"console tail:\n  [ 0.1] boot\n  [ 0.2] panic\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sandbox info lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, d, "--json", "sandbox", "info", "sb-1")
	var got apiv1.Sandbox
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.ConsoleTail != sb.ConsoleTail || got.DeadReason != sb.DeadReason {
		t.Fatalf("sandbox info --json: %v\n%s", err, out)
	}
}

func TestExecJSONPrintsEvents(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/sb-1/exec", func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(apiv1.ExecEvent{Type: "stdout", Data: []byte("out\n")})
		enc.Encode(apiv1.ExecEvent{Type: "stderr", Data: []byte("err\n")})
		enc.Encode(apiv1.ExecEvent{Type: "exit", ExitCode: 3})
	})
	d := newFakeDaemon(t, mux)
	out, err := runCLI(t, d, "--json", "exec", "sb-1", "--", "sh", "-c", "x")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 3 {
		t.Fatalf("exit: %v, want the command's code 3", err)
	}
	var types []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev apiv1.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("stdout line %q is not an event: %v", sc.Text(), err)
		}
		types = append(types, ev.Type+":"+string(ev.Data))
	}
	if strings.Join(types, ",") != "stdout:out\n,stderr:err\n,exit:" {
		t.Fatalf("events %q", types)
	}
}

func TestCpModeJSONAndOut(t *testing.T) {
	content := "hello\n"
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/sandboxes/sb-1/files", func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(apiv1.FileInfo{Name: "f", Path: r.URL.Query().Get("path"), Size: int64(len(data))})
	})
	mux.HandleFunc("GET /v1/sandboxes/sb-1/files", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, content) })
	d := newFakeDaemon(t, mux)
	src := filepath.Join(t.TempDir(), "src")
	os.WriteFile(src, []byte(content), 0o600)

	if _, err := runCLI(t, d, "cp", "--mode", "755", src, "sb-1:/root/f"); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, d, "cp", src, "sb-1:/root/g"); err != nil {
		t.Fatal(err)
	}
	var modes []string
	for _, r := range d.requests() {
		if r.Method == http.MethodPut {
			modes = append(modes, r.URL.Query().Get("mode"))
		}
	}
	if strings.Join(modes, ",") != "0755,0644" {
		t.Fatalf("modes sent %v, want 0755 (octal, as given) then the default 0644", modes)
	}
	if _, err := runCLI(t, d, "cp", "--mode", "9", src, "sb-1:/root/f"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("--mode 9: %v", err)
	}

	dst := filepath.Join(t.TempDir(), "out")
	out, err := runCLI(t, d, "--json", "cp", "sb-1:/root/f", dst)
	var fi apiv1.FileInfo
	if err != nil || json.Unmarshal([]byte(out), &fi) != nil {
		t.Fatalf("cp out --json: %v\n%q", err, out)
	}
	if data, _ := os.ReadFile(dst); string(data) != content || fi.Path != dst || fi.Size != int64(len(content)) || fi.Name != "out" {
		t.Fatalf("cp out: file %q, printed %+v", data, fi)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]uint32{"644": 0o644, "0644": 0o644, "0o755": 0o755, "1777": 0o1777, "0": 0} {
		if got, err := parseMode(in); err != nil || got != want {
			t.Errorf("parseMode(%q) = %o, %v; want %o", in, got, err, want)
		}
	}
	for _, in := range []string{"", "8", "0x1ff", "rwx", "17777", "-1", "0o"} {
		if _, err := parseMode(in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("parseMode(%q): %v, want invalid argument", in, err)
		}
	}
}

func TestCodeErrorText(t *testing.T) {
	tb := "Traceback (most recent call last):\n  File \"<cell>\", line 1, in <module>\nZeroDivisionError: division by zero\n"
	for _, c := range []struct {
		name string
		e    apiv1.CodeError
		want string
	}{
		{"traceback ending with the error", apiv1.CodeError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: tb}, tb},
		{"no traceback (timeout)", apiv1.CodeError{Name: "TimeoutError", Value: "code ran past its timeout"}, "TimeoutError: code ran past its timeout\n"},
		{"traceback ending otherwise", apiv1.CodeError{Name: "TimeoutError", Value: "interrupted", Traceback: "Traceback ...\nKeyboardInterrupt"},
			"Traceback ...\nKeyboardInterrupt\nTimeoutError: interrupted\n"},
		{"no value", apiv1.CodeError{Name: "StopIteration"}, "StopIteration\n"},
		{"nothing at all", apiv1.CodeError{}, "Python error (no name, value or traceback)\n"},
	} {
		if got := codeErrorText(&c.e); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestErrorsAsProblemJSON(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		writeProblemJSON(w, apiv1.Problem{Type: "https://forkd.dev/problems/not_found", Title: "Not Found", Status: 404,
			Detail: `snapshot "nope" not found; tags: a, b`, Code: "not_found", RequestID: "req-7"})
	})
	d := newFakeDaemon(t, mux)
	_, err := runCLI(t, d, "--json", "fork", "--tag", "nope")
	if err == nil || exitCodeOf(err) != 3 {
		t.Fatalf("fork of a missing tag: %v (exit %d), want not found (exit 3)", err, exitCodeOf(err))
	}
	var buf bytes.Buffer
	printError(&buf, err, true)
	var p apiv1.Problem
	if err := json.Unmarshal(buf.Bytes(), &p); err != nil || strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("not one line of JSON: %q", buf.String())
	}
	if p.Status != 404 || p.Code != "not_found" || p.Title != "Not Found" || p.RequestID != "req-7" || !strings.Contains(p.Detail, `snapshot "nope" not found`) {
		t.Fatalf("problem %+v", p)
	}

	// A local error is rendered by its class, as the API would.
	_, err = runCLI(t, d, "--json", "fork", "--tag", "nope", "-n", "0")
	buf.Reset()
	printError(&buf, err, true)
	p = apiv1.Problem{}
	json.Unmarshal(buf.Bytes(), &p)
	if exitCodeOf(err) != 2 || p.Status != 400 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "-n 0") {
		t.Fatalf("-n 0: exit %d, problem %+v", exitCodeOf(err), p)
	}
	buf.Reset()
	printError(&buf, err, false)
	if !strings.HasPrefix(buf.String(), "forkd: -n 0") {
		t.Fatalf("text error: %q", buf.String())
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		t.Fatalf("-n 0 reached the daemon: %v", err)
	}
}

// Cobra's own errors (usage) are invalid arguments: exit 2, and with
// --json a 400 invalid_argument problem naming the help to read, not a
// 500 "internal" one.
func TestUsageErrorsAreInvalidArgument(t *testing.T) {
	for _, args := range [][]string{
		{"fork"},                          // required --tag not set
		{"fork", "--tag", "t", "-n", "x"}, // bad flag value
		{"exec", "sb-1"},                  // too few arguments
		{"ls", "--no-such-flag"},          // unknown flag
		{"no-such-command"},               // unknown command
	} {
		_, err := runCLI(t, nil, append([]string{"--json"}, args...)...)
		if err == nil {
			t.Fatalf("%q: no error", args)
		}
		var buf bytes.Buffer
		printError(&buf, err, true)
		var p apiv1.Problem
		json.Unmarshal(buf.Bytes(), &p)
		if exitCodeOf(err) != 2 || p.Status != 400 || p.Code != "invalid_argument" || !strings.Contains(p.Detail, "--help") {
			t.Errorf("%q: exit %d, problem %+v", args, exitCodeOf(err), p)
		}
	}
	// An error of the command itself keeps its class.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/sb-1", func(w http.ResponseWriter, r *http.Request) {
		writeProblemJSON(w, apiv1.Problem{Title: "Not Found", Status: 404, Detail: "sandbox sb-1 not found", Code: "not_found"})
	})
	if _, err := runCLI(t, newFakeDaemon(t, mux), "sandbox", "info", "sb-1"); exitCodeOf(err) != 3 || strings.Contains(err.Error(), "--help") {
		t.Errorf("not found from the daemon: %v (exit %d)", err, exitCodeOf(err))
	}
}
