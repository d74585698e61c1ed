package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Defaults and bounds of tool arguments.
const (
	defaultLifetimeSeconds = 3600
	defaultCommandTimeout  = 60
	maxTimeoutSeconds      = 3600
	defaultReadBytes       = 1 << 20
	maxReadBytes           = 16 << 20
	// maxStreamOutput bounds each of stdout and stderr in a run_command
	// result (head and tail are kept): a model's context is the limit.
	maxStreamOutput = 64 << 10
)

// tools holds the tool handlers.
type tools struct {
	b    Backend
	opts Options
}

// ---- shared argument and result types ----

// SandboxInfo is a sandbox as the tools report it.
type SandboxInfo struct {
	ID                 string            `json:"id" jsonschema:"sandbox id (sb-…): pass it as sandbox_id to the other tools"`
	Tag                string            `json:"tag" jsonschema:"snapshot tag the sandbox was forked from"`
	State              string            `json:"state" jsonschema:"starting (its fork has not answered yet), running, dead (its VM exited on its own; see dead_reason) or stopped (killed)"`
	Created            string            `json:"created" jsonschema:"creation time (RFC 3339)"`
	ReadyMillis        float64           `json:"ready_ms,omitempty" jsonschema:"fork-to-ready time in milliseconds"`
	ExpiresAt          string            `json:"expires_at,omitempty" jsonschema:"when the sandbox's timeout ends it (RFC 3339); absent: no limit"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_s,omitempty" jsonschema:"the sandbox ends after this many seconds without a request"`
	Metadata           map[string]string `json:"metadata,omitempty" jsonschema:"labels given at creation"`
	DeadReason         string            `json:"dead_reason,omitempty" jsonschema:"why a dead sandbox's VM exited"`
	Network            *NetworkInfo      `json:"network,omitempty" jsonschema:"what the sandbox may reach on the network"`
}

func sandboxInfo(s apiv1.Sandbox) SandboxInfo {
	out := SandboxInfo{
		ID: s.ID, Tag: s.Tag, State: s.State, Created: s.Created.UTC().Format(time.RFC3339),
		ReadyMillis: s.ReadyMillis, IdleTimeoutSeconds: s.IdleTimeoutSeconds, Metadata: s.Metadata, DeadReason: s.DeadReason,
		Network: networkInfo(s),
	}
	if s.ExpiresAt != nil && !s.ExpiresAt.IsZero() {
		out.ExpiresAt = s.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return out
}

// FileEntry describes a file in a sandbox.
type FileEntry struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Mode    string `json:"mode" jsonschema:"permission bits in octal, e.g. 0644"`
	IsDir   bool   `json:"is_dir,omitempty"`
	IsLink  bool   `json:"is_link,omitempty"`
	ModTime string `json:"mod_time,omitempty" jsonschema:"modification time (RFC 3339)"`
}

func fileEntry(f apiv1.FileInfo) FileEntry {
	e := FileEntry{Name: f.Name, Path: f.Path, Size: f.Size, Mode: fmt.Sprintf("%04o", f.Mode), IsDir: f.IsDir, IsLink: f.IsLink}
	if !f.ModTime.IsZero() {
		e.ModTime = f.ModTime.UTC().Format(time.RFC3339)
	}
	return e
}

// toolError is what a failed call reports to the model: the daemon's
// message and its error class, so the model can tell "no such sandbox"
// from "bad argument" from "try again".
func toolError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%v (%s)", err, errdefs.Code(err))
}

// argError is an invalid argument caught before any call to the daemon,
// reported like the daemon's own invalid_argument problems.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg + " (invalid_argument)" }
func (e *argError) Unwrap() error { return errdefs.ErrInvalidArgument }

func invalid(format string, args ...any) error { return &argError{fmt.Sprintf(format, args...)} }

func text(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }

func seconds(s int64) time.Duration { return time.Duration(s) * time.Second }

// ---- create_sandbox, fork_sandboxes ----

// CreateInput is create_sandbox's arguments.
type CreateInput struct {
	Tag                string            `json:"tag" jsonschema:"snapshot tag to fork the sandbox from (see list_snapshots)"`
	TimeoutSeconds     *int64            `json:"timeout_seconds,omitempty" jsonschema:"lifetime in seconds: the sandbox is killed this long after creation (0: no limit, kill it yourself with kill_sandbox)"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_seconds,omitempty" jsonschema:"kill the sandbox after this many seconds without any request (0: no idle limit)"`
	Metadata           map[string]string `json:"metadata,omitempty" jsonschema:"labels to attach (string keys and values); list_sandboxes can filter on them"`
	Network            *NetworkInput     `json:"network,omitempty" jsonschema:"what the sandbox may reach: {mode: none|public|allow, allow: [...]}; absent: the snapshot's policy, else the daemon's default"`
}

// ForkInput is fork_sandboxes' arguments.
type ForkInput struct {
	Tag                string            `json:"tag" jsonschema:"snapshot tag to fork from (see list_snapshots)"`
	N                  int               `json:"n" jsonschema:"how many sandboxes to create"`
	TimeoutSeconds     *int64            `json:"timeout_seconds,omitempty" jsonschema:"lifetime of each sandbox in seconds (0: no limit)"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_seconds,omitempty" jsonschema:"kill a sandbox after this many seconds without any request (0: no idle limit)"`
	Metadata           map[string]string `json:"metadata,omitempty" jsonschema:"labels to attach to every sandbox"`
	Network            *NetworkInput     `json:"network,omitempty" jsonschema:"what every sandbox may reach: {mode: none|public|allow, allow: [...]}; absent: the snapshot's policy, else the daemon's default"`
}

// ForkOutput lists new sandboxes.
type ForkOutput struct {
	Sandboxes   []SandboxInfo `json:"sandboxes"`
	TotalMillis float64       `json:"total_ms" jsonschema:"time the whole fork took, in milliseconds"`
}

func lifetime(s *int64) int64 {
	if s == nil {
		return defaultLifetimeSeconds
	}
	return *s
}

func checkTimeouts(timeout *int64, idle int64) error {
	if timeout != nil && *timeout < 0 {
		return invalid("timeout_seconds %d: want 0 (no limit) or a positive number of seconds", *timeout)
	}
	if idle < 0 {
		return invalid("idle_timeout_seconds %d: want 0 (no limit) or a positive number of seconds", idle)
	}
	return nil
}

func (t *tools) fork(ctx context.Context, tag string, n int, timeout *int64, idle int64, md map[string]string, network *NetworkInput) (apiv1.ForkResponse, error) {
	if strings.TrimSpace(tag) == "" {
		return apiv1.ForkResponse{}, invalid("tag is empty: give a snapshot tag (list_snapshots shows them)")
	}
	if err := checkTimeouts(timeout, idle); err != nil {
		return apiv1.ForkResponse{}, err
	}
	policy, err := networkPolicy(network)
	if err != nil {
		return apiv1.ForkResponse{}, err
	}
	return t.b.Fork(ctx, apiv1.ForkRequest{
		Tag: tag, Count: n, TimeoutSeconds: ptr(lifetime(timeout)), IdleTimeoutSeconds: idle, Metadata: md, Network: policy,
	})
}

func describeLifetime(s SandboxInfo) string {
	var parts []string
	if s.ExpiresAt != "" {
		parts = append(parts, "expires at "+s.ExpiresAt)
	} else {
		parts = append(parts, "no time limit")
	}
	if s.IdleTimeoutSeconds > 0 {
		parts = append(parts, fmt.Sprintf("ends after %d s idle", s.IdleTimeoutSeconds))
	}
	if n := describeNetwork(s.Network); n != "" {
		parts = append(parts, n)
	}
	return strings.Join(parts, ", ")
}

func (t *tools) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, SandboxInfo, error) {
	resp, err := t.fork(ctx, in.Tag, 1, in.TimeoutSeconds, in.IdleTimeoutSeconds, in.Metadata, in.Network)
	if err != nil {
		return nil, SandboxInfo{}, toolError(err)
	}
	if len(resp.Sandboxes) != 1 {
		return nil, SandboxInfo{}, fmt.Errorf("daemon answered %d sandboxes for 1 (internal)", len(resp.Sandboxes))
	}
	s := sandboxInfo(resp.Sandboxes[0])
	msg := fmt.Sprintf("Created sandbox %s from snapshot %q (ready in %.1f ms; %s).\n"+
		"Use sandbox_id %q with run_command, run_code, read_file, write_file and list_files; kill_sandbox when done.",
		s.ID, s.Tag, s.ReadyMillis, describeLifetime(s), s.ID)
	return &mcp.CallToolResult{Content: text(msg)}, s, nil
}

func (t *tools) forkSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in ForkInput) (*mcp.CallToolResult, ForkOutput, error) {
	if in.N < 1 {
		return nil, ForkOutput{}, invalid("n %d: want at least 1", in.N)
	}
	resp, err := t.fork(ctx, in.Tag, in.N, in.TimeoutSeconds, in.IdleTimeoutSeconds, in.Metadata, in.Network)
	if err != nil {
		return nil, ForkOutput{}, toolError(err)
	}
	out := ForkOutput{Sandboxes: []SandboxInfo{}, TotalMillis: resp.TotalMillis}
	var ids []string
	for _, s := range resp.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxInfo(s))
		ids = append(ids, s.ID)
	}
	msg := fmt.Sprintf("Forked %d sandboxes from snapshot %q in %.1f ms: %s", len(ids), in.Tag, resp.TotalMillis, strings.Join(ids, ", "))
	if len(out.Sandboxes) > 0 {
		msg += " (" + describeLifetime(out.Sandboxes[0]) + ")"
	}
	return &mcp.CallToolResult{Content: text(msg)}, out, nil
}

// ---- run_command ----

// CommandInput is run_command's arguments.
type CommandInput struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"the sandbox to run in"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"program and arguments, run directly without a shell (no quoting, globbing or variable expansion), e.g. [\"python3\", \"-c\", \"print(1)\"]. Give argv or shell, not both."`
	Shell          string            `json:"shell,omitempty" jsonschema:"a shell command line run with /bin/sh -c (pipes, redirection, && and globbing work), e.g. \"ls -l /tmp | wc -l\". Give argv or shell, not both."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"absolute working directory (default /)"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text written to the process's standard input (default: none, stdin is /dev/null)"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"kill the process (and its children) after this many seconds"`
}

// CommandOutput is run_command's result.
type CommandOutput struct {
	ExitCode        int     `json:"exit_code" jsonschema:"the process's exit status (128+N when killed by signal N)"`
	Signal          string  `json:"signal,omitempty" jsonschema:"the signal that killed the process, e.g. SIGKILL"`
	TimedOut        bool    `json:"timed_out,omitempty" jsonschema:"true when the timeout killed the process"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdout_truncated,omitempty" jsonschema:"stdout was longer than 64 KiB; its middle was cut"`
	StderrTruncated bool    `json:"stderr_truncated,omitempty" jsonschema:"stderr was longer than 64 KiB; its middle was cut"`
	DurationMillis  float64 `json:"duration_ms"`
}

func (t *tools) runCommand(ctx context.Context, _ *mcp.CallToolRequest, in CommandInput) (*mcp.CallToolResult, CommandOutput, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, CommandOutput{}, err
	}
	switch {
	case len(in.Argv) > 0 && in.Shell != "":
		return nil, CommandOutput{}, invalid("give either argv (a program and its arguments, no shell) or shell (a command line for /bin/sh -c), not both")
	case len(in.Argv) == 0 && strings.TrimSpace(in.Shell) == "":
		return nil, CommandOutput{}, invalid("nothing to run: give argv (e.g. [\"ls\", \"-l\", \"/\"]) or shell (e.g. \"ls -l / | head\")")
	case len(in.Argv) > 0 && in.Argv[0] == "":
		return nil, CommandOutput{}, invalid("argv[0] is empty: it names the program to run")
	}
	if in.Cwd != "" && !path.IsAbs(in.Cwd) {
		return nil, CommandOutput{}, invalid("cwd %q: want an absolute path", in.Cwd)
	}
	timeout := in.TimeoutSeconds
	if timeout == 0 {
		timeout = defaultCommandTimeout
	}
	if timeout < 0 || timeout > maxTimeoutSeconds {
		return nil, CommandOutput{}, invalid("timeout_seconds %d: want 1 to %d", timeout, maxTimeoutSeconds)
	}
	req := apiv1.ExecRequest{Argv: in.Argv, Shell: in.Shell, Env: in.Env, Cwd: in.Cwd, TimeoutMillis: timeout * 1000}
	var stdin *strings.Reader
	if in.Stdin != "" {
		req.Stdin = true
		stdin = strings.NewReader(in.Stdin)
	}
	stdout, stderr := newCapBuffer(maxStreamOutput), newCapBuffer(maxStreamOutput)
	var exit apiv1.ExecEvent
	var err error
	if stdin != nil {
		exit, err = t.b.Exec(ctx, in.SandboxID, req, stdin, stdout, stderr)
	} else {
		exit, err = t.b.Exec(ctx, in.SandboxID, req, nil, stdout, stderr)
	}
	if err != nil {
		return nil, CommandOutput{}, toolError(err)
	}
	out := CommandOutput{
		ExitCode: exit.ExitCode, Signal: exit.Signal, TimedOut: exit.TimedOut,
		Stdout: stdout.String(), Stderr: stderr.String(), StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated,
		DurationMillis: float64(exit.DurationMicros) / 1000,
	}
	return &mcp.CallToolResult{Content: text(commandText(out, timeout))}, out, nil
}

func commandText(o CommandOutput, timeout int64) string {
	var b strings.Builder
	switch {
	case o.TimedOut:
		fmt.Fprintf(&b, "Timed out after %d s and was killed (exit code %d", timeout, o.ExitCode)
		if o.Signal != "" {
			fmt.Fprintf(&b, ", %s", o.Signal)
		}
		b.WriteString(").")
	case o.Signal != "":
		fmt.Fprintf(&b, "Killed by %s (exit code %d).", o.Signal, o.ExitCode)
	case o.ExitCode != 0:
		fmt.Fprintf(&b, "Exited with code %d (failure).", o.ExitCode)
	default:
		b.WriteString("Exited with code 0.")
	}
	fmt.Fprintf(&b, " Took %.0f ms.\n", o.DurationMillis)
	section(&b, "stdout", o.Stdout, o.StdoutTruncated)
	section(&b, "stderr", o.Stderr, o.StderrTruncated)
	return strings.TrimRight(b.String(), "\n")
}

func section(b *strings.Builder, name, s string, truncated bool) {
	if s == "" {
		fmt.Fprintf(b, "%s: (empty)\n", name)
		return
	}
	note := ""
	if truncated {
		note = " (over 64 KiB: the middle was cut)"
	}
	fmt.Fprintf(b, "%s%s:\n%s", name, note, s)
	if !strings.HasSuffix(s, "\n") {
		b.WriteString("\n")
	}
}

// ---- run_code ----

// CodeInput is run_code's arguments.
type CodeInput struct {
	SandboxID      string `json:"sandbox_id" jsonschema:"the sandbox to run in; its snapshot must have Python (list_snapshots shows python=true)"`
	Code           string `json:"code" jsonschema:"Python source run in the sandbox's persistent session: variables, imports and functions persist across calls, as in a notebook. The value of a final expression is returned; matplotlib figures and display() outputs come back as images or text."`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty" jsonschema:"interrupt the code after this many seconds (the session and its variables survive)"`
}

// CodeError is a Python exception.
type CodeError struct {
	Name      string `json:"name" jsonschema:"exception class, e.g. NameError"`
	Value     string `json:"value" jsonschema:"exception message"`
	Traceback string `json:"traceback"`
}

// CodeOutput is run_code's result. Images are not repeated here: they are
// the image content of the result, in order (result first, then display
// outputs).
type CodeOutput struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Result and Display are the rich outputs by MIME type, without images.
	Result         map[string]string   `json:"result,omitempty" jsonschema:"value of the last expression by MIME type (text/plain, text/html, ...); images are returned as image content instead"`
	Display        []map[string]string `json:"display,omitempty" jsonschema:"display() outputs and figures in order, by MIME type; images are returned as image content instead"`
	Images         []string            `json:"images,omitempty" jsonschema:"MIME types of the image content blocks returned, in order"`
	Error          *CodeError          `json:"error,omitempty" jsonschema:"the exception the code raised, if any"`
	TimedOut       bool                `json:"timed_out,omitempty" jsonschema:"the timeout interrupted the code"`
	DurationMillis float64             `json:"duration_ms"`
}

// imageTypes are the MIME types returned as MCP image content (decoded
// from the base64 the Python session sends).
var imageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// textOrder is the order in which a rich output's text forms are shown.
var textOrder = []string{"text/plain", "text/markdown", "text/html", "text/latex", "application/json", "image/svg+xml"}

// splitMIME separates a MIME bundle into its images (as content) and the
// rest.
func splitMIME(bundle map[string]string) (rest map[string]string, images []*mcp.ImageContent, bad []string) {
	for mt, v := range bundle {
		if !isImageType(mt) {
			if rest == nil {
				rest = map[string]string{}
			}
			rest[mt] = v
		}
	}
	for _, mt := range imageTypes {
		v, ok := bundle[mt]
		if !ok {
			continue
		}
		data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
		if err != nil {
			bad = append(bad, mt)
			continue
		}
		images = append(images, &mcp.ImageContent{Data: data, MIMEType: mt})
	}
	return rest, images, bad
}

// bestText is the text form of a MIME bundle a model reads best.
func bestText(bundle map[string]string) (string, string) {
	for _, mt := range textOrder {
		if v, ok := bundle[mt]; ok {
			return mt, v
		}
	}
	for mt, v := range bundle {
		return mt, v
	}
	return "", ""
}

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in CodeInput) (*mcp.CallToolResult, CodeOutput, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, CodeOutput{}, err
	}
	if strings.TrimSpace(in.Code) == "" {
		return nil, CodeOutput{}, invalid("code is empty")
	}
	timeout := in.TimeoutSeconds
	if timeout == 0 {
		timeout = defaultCommandTimeout
	}
	if timeout < 0 || timeout > maxTimeoutSeconds {
		return nil, CodeOutput{}, invalid("timeout_seconds %d: want 1 to %d", timeout, maxTimeoutSeconds)
	}
	res, err := t.b.RunCode(ctx, in.SandboxID, apiv1.RunCodeRequest{Code: in.Code, TimeoutMillis: timeout * 1000})
	if err != nil {
		return nil, CodeOutput{}, toolError(err)
	}
	out := CodeOutput{Stdout: res.Stdout, Stderr: res.Stderr, TimedOut: res.TimedOut, DurationMillis: float64(res.DurationMicros) / 1000}
	if res.Error != nil {
		out.Error = &CodeError{Name: res.Error.Name, Value: res.Error.Value, Traceback: res.Error.Traceback}
	}
	var images []mcp.Content
	var b strings.Builder
	addBundle := func(label string, bundle map[string]string) map[string]string {
		rest, imgs, bad := splitMIME(bundle)
		for _, img := range imgs {
			images = append(images, img)
			out.Images = append(out.Images, img.MIMEType)
			fmt.Fprintf(&b, "%s: %s image (%d bytes, attached as image #%d)\n", label, img.MIMEType, len(img.Data), len(images))
		}
		for _, mt := range bad {
			fmt.Fprintf(&b, "%s: %s output that is not valid base64 (dropped)\n", label, mt)
		}
		if mt, v := bestText(rest); mt != "" && (len(imgs) == 0 || mt != "text/plain" || !strings.HasPrefix(v, "<Figure")) {
			fmt.Fprintf(&b, "%s (%s):\n%s\n", label, mt, strings.TrimRight(v, "\n"))
		}
		return rest
	}
	if out.Error != nil {
		fmt.Fprintf(&b, "Raised %s: %s\n", out.Error.Name, out.Error.Value)
	} else if out.TimedOut {
		fmt.Fprintf(&b, "Interrupted by the %d s timeout (the session and its variables are kept).\n", timeout)
	} else {
		b.WriteString("Ran successfully.\n")
	}
	if out.Stdout != "" {
		fmt.Fprintf(&b, "stdout:\n%s\n", strings.TrimRight(out.Stdout, "\n"))
	}
	if out.Stderr != "" {
		fmt.Fprintf(&b, "stderr:\n%s\n", strings.TrimRight(out.Stderr, "\n"))
	}
	if len(res.Result) > 0 {
		out.Result = addBundle("result", res.Result)
	}
	for i, d := range res.Display {
		rest := addBundle(fmt.Sprintf("display[%d]", i), d)
		if rest == nil {
			rest = map[string]string{}
		}
		out.Display = append(out.Display, rest)
	}
	if out.Error != nil && out.Error.Traceback != "" {
		fmt.Fprintf(&b, "traceback:\n%s\n", strings.TrimRight(out.Error.Traceback, "\n"))
	}
	content := append(text(strings.TrimRight(b.String(), "\n")), images...)
	return &mcp.CallToolResult{Content: content}, out, nil
}

// ---- files ----

// ReadInput is read_file's arguments.
type ReadInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to read from"`
	Path      string `json:"path" jsonschema:"absolute path of the file in the sandbox"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"auto (default: UTF-8 text as text, PNG/JPEG/GIF/WebP as an image, anything else as base64), text, or base64"`
	MaxBytes  int64  `json:"max_bytes,omitempty" jsonschema:"read at most this many bytes (default 1 MiB, at most 16 MiB); a longer file is truncated and says so"`
}

// ReadOutput is read_file's result.
type ReadOutput struct {
	Path      string `json:"path"`
	Size      int64  `json:"size" jsonschema:"bytes read"`
	Encoding  string `json:"encoding" jsonschema:"text, base64, or image (the bytes are the image content of the result)"`
	MIMEType  string `json:"mime_type,omitempty"`
	Content   string `json:"content,omitempty" jsonschema:"the file's contents, as encoding says (empty for image)"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"the file is longer than max_bytes; only its start was read"`
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, ReadOutput, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, ReadOutput{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, ReadOutput{}, err
	}
	enc := in.Encoding
	switch enc {
	case "":
		enc = "auto"
	case "auto", "text", "base64":
	default:
		return nil, ReadOutput{}, invalid("encoding %q: want auto, text or base64", enc)
	}
	limit := in.MaxBytes
	if limit == 0 {
		limit = defaultReadBytes
	}
	if limit < 0 || limit > maxReadBytes {
		return nil, ReadOutput{}, invalid("max_bytes %d: want 1 to %d", limit, maxReadBytes)
	}
	buf := &limitBuffer{max: int(limit)}
	if _, err := t.b.ReadFile(ctx, in.SandboxID, in.Path, buf); err != nil && !errors.Is(err, errLimit) {
		return nil, ReadOutput{}, toolError(err)
	}
	data := buf.Bytes()
	out := ReadOutput{Path: in.Path, Size: int64(len(data)), Truncated: buf.truncated}
	note := ""
	if buf.truncated {
		note = fmt.Sprintf("\n[truncated: only the first %d bytes were read; pass a larger max_bytes (up to %d) to read more]", len(data), maxReadBytes)
	}
	if enc == "auto" {
		switch mt := http.DetectContentType(data); {
		case !buf.truncated && len(data) > 0 && isImageType(mt):
			out.Encoding, out.MIMEType = "image", mt
			msg := fmt.Sprintf("%s: %s image, %d bytes (attached).", in.Path, mt, len(data))
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}, &mcp.ImageContent{Data: data, MIMEType: mt}}}, out, nil
		case utf8.Valid(data):
			enc = "text"
		default:
			enc = "base64"
		}
	}
	out.Encoding = enc
	if enc == "text" {
		out.Content = strings.ToValidUTF8(string(data), "\uFFFD")
		return &mcp.CallToolResult{Content: text(out.Content + note)}, out, nil
	}
	out.Content = base64.StdEncoding.EncodeToString(data)
	msg := fmt.Sprintf("%s: %d bytes of binary data (%s), base64:\n%s%s", in.Path, len(data), http.DetectContentType(data), out.Content, note)
	return &mcp.CallToolResult{Content: text(msg)}, out, nil
}

func isImageType(mt string) bool {
	for _, it := range imageTypes {
		if mt == it {
			return true
		}
	}
	return false
}

// WriteInput is write_file's arguments.
type WriteInput struct {
	SandboxID   string `json:"sandbox_id" jsonschema:"the sandbox to write in"`
	Path        string `json:"path" jsonschema:"absolute path of the file; it is created or replaced atomically"`
	Content     string `json:"content" jsonschema:"the file's new contents"`
	Encoding    string `json:"encoding,omitempty" jsonschema:"text (default: content is written as UTF-8) or base64 (content is decoded first, for binary files)"`
	Mode        string `json:"mode,omitempty" jsonschema:"permission bits in octal (default 0644; 0755 for an executable script)"`
	MakeParents *bool  `json:"make_parents,omitempty" jsonschema:"create missing parent directories (default true)"`
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, FileEntry, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, FileEntry{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, FileEntry{}, err
	}
	var data []byte
	switch in.Encoding {
	case "", "text":
		data = []byte(in.Content)
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(in.Content)); err != nil {
			return nil, FileEntry{}, invalid("content is not valid base64: %v", err)
		}
	default:
		return nil, FileEntry{}, invalid("encoding %q: want text or base64", in.Encoding)
	}
	mode := uint64(0o644)
	if in.Mode != "" {
		m, err := strconv.ParseUint(strings.TrimPrefix(in.Mode, "0o"), 8, 32)
		if err != nil || m > 0o7777 {
			return nil, FileEntry{}, invalid("mode %q: want octal permission bits like 0644 or 0755", in.Mode)
		}
		mode = m
	}
	fi, err := t.b.WriteFile(ctx, in.SandboxID, in.Path, uint32(mode), bytes.NewReader(data))
	if err != nil && errdefs.IsNotFound(err) && (in.MakeParents == nil || *in.MakeParents) {
		// Most likely a missing parent directory (or no such sandbox, which
		// mkdir reports in turn): create it, then write again.
		if _, merr := t.b.Mkdir(ctx, in.SandboxID, apiv1.MkdirRequest{Path: path.Dir(in.Path), Parents: true}); merr == nil {
			fi, err = t.b.WriteFile(ctx, in.SandboxID, in.Path, uint32(mode), bytes.NewReader(data))
		} else if !errdefs.IsAlreadyExists(merr) {
			err = merr
		}
	}
	if err != nil {
		return nil, FileEntry{}, toolError(err)
	}
	e := fileEntry(fi)
	return &mcp.CallToolResult{Content: text(fmt.Sprintf("Wrote %d bytes to %s (mode %s).", e.Size, e.Path, e.Mode))}, e, nil
}

// ListInput is list_files' arguments.
type ListInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to look in"`
	Path      string `json:"path" jsonschema:"absolute path of a directory, e.g. / or /tmp"`
}

// ListOutput is list_files' result.
type ListOutput struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, ListOutput, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, ListOutput{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, ListOutput{}, err
	}
	list, err := t.b.ListFiles(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, ListOutput{}, toolError(err)
	}
	out := ListOutput{Path: in.Path, Entries: []FileEntry{}}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d entries\n", in.Path, len(list))
	for _, f := range list {
		e := fileEntry(f)
		out.Entries = append(out.Entries, e)
		kind, name := "-", e.Name
		switch {
		case e.IsDir:
			kind, name = "d", name+"/"
		case e.IsLink:
			kind, name = "l", name+"@"
		}
		fmt.Fprintf(&b, "%s%s %10d  %s  %s\n", kind, e.Mode, e.Size, e.ModTime, name)
	}
	return &mcp.CallToolResult{Content: text(strings.TrimRight(b.String(), "\n"))}, out, nil
}

// ---- branch_sandbox ----

// BranchInput is branch_sandbox's arguments.
type BranchInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the running sandbox to save; it keeps running"`
	Tag       string `json:"tag" jsonschema:"new snapshot tag to create (letters, digits, . _ -; must not exist yet)"`
	Mode      string `json:"mode,omitempty" jsonschema:"diff (default: copies only the pages the sandbox changed, pause of a few ms), full (copies all memory while paused) or live (the sandbox keeps running while its memory is saved; needs a daemon set up for it)"`
}

// BranchOutput is branch_sandbox's result.
type BranchOutput struct {
	Tag          string  `json:"tag" jsonschema:"the new snapshot tag: fork it with create_sandbox or fork_sandboxes"`
	SnapshotID   string  `json:"snapshot_id"`
	Mode         string  `json:"mode"`
	State        string  `json:"state" jsonschema:"ready, or writing while a live branch is still being saved"`
	PauseMillis  float64 `json:"pause_ms" jsonschema:"how long the source sandbox was paused"`
	BytesWritten int64   `json:"bytes_written"`
	TotalMillis  float64 `json:"total_ms"`
}

func (t *tools) branchSandbox(ctx context.Context, _ *mcp.CallToolRequest, in BranchInput) (*mcp.CallToolResult, BranchOutput, error) {
	if err := checkSandboxID(in.SandboxID); err != nil {
		return nil, BranchOutput{}, err
	}
	if strings.TrimSpace(in.Tag) == "" {
		return nil, BranchOutput{}, invalid("tag is empty: name the new snapshot")
	}
	mode := in.Mode
	switch mode {
	case "":
		mode = "diff"
	case "diff", "full", "live":
	default:
		return nil, BranchOutput{}, invalid("mode %q: want diff, full or live", in.Mode)
	}
	resp, err := t.b.Branch(ctx, in.SandboxID, apiv1.BranchRequest{Tag: in.Tag, Mode: mode})
	if err != nil {
		return nil, BranchOutput{}, toolError(err)
	}
	out := BranchOutput{
		Tag: resp.Snapshot.Tag, SnapshotID: resp.Snapshot.ID, Mode: mode, State: resp.Snapshot.State,
		PauseMillis: resp.PauseMillis, BytesWritten: resp.BytesWritten, TotalMillis: resp.TotalMillis,
	}
	msg := fmt.Sprintf("Saved sandbox %s as snapshot %q (%s branch, paused %.1f ms, %d bytes written, %.0f ms in all); the sandbox keeps running.\n"+
		"Fork the saved state with create_sandbox or fork_sandboxes tag=%q.", in.SandboxID, out.Tag, mode, out.PauseMillis, out.BytesWritten, out.TotalMillis, out.Tag)
	return &mcp.CallToolResult{Content: text(msg)}, out, nil
}

// ---- list_sandboxes, kill_sandbox, list_snapshots ----

// ListSandboxesInput is list_sandboxes' arguments.
type ListSandboxesInput struct {
	Tag      string            `json:"tag,omitempty" jsonschema:"only sandboxes forked from this snapshot tag"`
	State    string            `json:"state,omitempty" jsonschema:"only sandboxes in this state: starting, running, dead or stopped"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only sandboxes with all these labels"`
}

// ListSandboxesOutput is list_sandboxes' result.
type ListSandboxesOutput struct {
	Sandboxes []SandboxInfo `json:"sandboxes"`
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in ListSandboxesInput) (*mcp.CallToolResult, ListSandboxesOutput, error) {
	if in.State != "" && !slices.Contains(apiv1.SandboxStates, in.State) {
		return nil, ListSandboxesOutput{}, invalid("state %q: want one of %s", in.State, strings.Join(apiv1.SandboxStates, ", "))
	}
	var labels []string
	for k, v := range in.Metadata {
		labels = append(labels, k+"="+v)
	}
	list, err := t.b.Sandboxes(ctx, in.Tag, in.State, labels...)
	if err != nil {
		return nil, ListSandboxesOutput{}, toolError(err)
	}
	out := ListSandboxesOutput{Sandboxes: []SandboxInfo{}}
	var b strings.Builder
	fmt.Fprintf(&b, "%d sandboxes\n", len(list))
	for _, s := range list {
		si := sandboxInfo(s)
		out.Sandboxes = append(out.Sandboxes, si)
		fmt.Fprintf(&b, "%s  tag=%s  state=%s  created=%s", si.ID, si.Tag, si.State, si.Created)
		if si.ExpiresAt != "" {
			fmt.Fprintf(&b, "  expires=%s", si.ExpiresAt)
		}
		if len(si.Metadata) > 0 {
			md, _ := json.Marshal(si.Metadata)
			fmt.Fprintf(&b, "  metadata=%s", md)
		}
		if si.DeadReason != "" {
			fmt.Fprintf(&b, "  dead_reason=%q", si.DeadReason)
		}
		b.WriteString("\n")
	}
	return &mcp.CallToolResult{Content: text(strings.TrimRight(b.String(), "\n"))}, out, nil
}

// KillInput is kill_sandbox's arguments.
type KillInput struct {
	SandboxID  string   `json:"sandbox_id,omitempty" jsonschema:"the sandbox to kill"`
	SandboxIDs []string `json:"sandbox_ids,omitempty" jsonschema:"several sandboxes to kill at once (instead of, or besides, sandbox_id)"`
}

// KillOutput is kill_sandbox's result.
type KillOutput struct {
	Killed []string `json:"killed" jsonschema:"ids of the sandboxes killed"`
}

func (t *tools) killSandbox(ctx context.Context, _ *mcp.CallToolRequest, in KillInput) (*mcp.CallToolResult, KillOutput, error) {
	ids := append([]string(nil), in.SandboxIDs...)
	if in.SandboxID != "" {
		ids = append([]string{in.SandboxID}, ids...)
	}
	if len(ids) == 0 {
		return nil, KillOutput{}, invalid("give sandbox_id (or sandbox_ids) of the sandbox to kill")
	}
	for _, id := range ids {
		if err := checkSandboxID(id); err != nil {
			return nil, KillOutput{}, err
		}
	}
	killed, err := t.b.Kill(ctx, ids, false)
	if err != nil {
		return nil, KillOutput{}, toolError(err)
	}
	if killed == nil {
		killed = []string{}
	}
	return &mcp.CallToolResult{Content: text(fmt.Sprintf("Killed %d sandboxes: %s", len(killed), strings.Join(killed, ", ")))}, KillOutput{Killed: killed}, nil
}

// SnapshotInfo is a snapshot as list_snapshots reports it.
type SnapshotInfo struct {
	Tag       string `json:"tag" jsonschema:"pass it to create_sandbox or fork_sandboxes"`
	Recipe    string `json:"recipe" jsonschema:"the recipe the image was built from"`
	Python    bool   `json:"python" jsonschema:"true when sandboxes of this snapshot have a warmed Python session (run_code works)"`
	State     string `json:"state" jsonschema:"ready (can be forked), writing or failed"`
	Created   string `json:"created" jsonschema:"creation time (RFC 3339)"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	Parent    string `json:"parent,omitempty" jsonschema:"the tag this snapshot was branched from, if any"`
	Error     string `json:"error,omitempty"`
}

// ListSnapshotsOutput is list_snapshots' result.
type ListSnapshotsOutput struct {
	Snapshots []SnapshotInfo `json:"snapshots"`
}

func (t *tools) listSnapshots(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListSnapshotsOutput, error) {
	snaps, err := t.b.Snapshots(ctx)
	if err != nil {
		return nil, ListSnapshotsOutput{}, toolError(err)
	}
	out := ListSnapshotsOutput{Snapshots: []SnapshotInfo{}}
	var b strings.Builder
	fmt.Fprintf(&b, "%d snapshots\n", len(snaps))
	for _, s := range snaps {
		si := SnapshotInfo{
			Tag: s.Tag, Recipe: s.Recipe, Python: s.Python, State: s.State, Created: s.Created.UTC().Format(time.RFC3339),
			MemoryMiB: s.MemoryMiB, VCPUs: s.VCPUs, Error: s.Error,
		}
		if si.State == "" {
			si.State = apiv1.SnapshotReady
		}
		if s.Parent != nil {
			si.Parent = s.Parent.Tag
		}
		out.Snapshots = append(out.Snapshots, si)
		fmt.Fprintf(&b, "%s  recipe=%s  python=%t  state=%s  memory=%d MiB  created=%s", si.Tag, si.Recipe, si.Python, si.State, si.MemoryMiB, si.Created)
		if si.Parent != "" {
			fmt.Fprintf(&b, "  parent=%s", si.Parent)
		}
		b.WriteString("\n")
	}
	return &mcp.CallToolResult{Content: text(strings.TrimRight(b.String(), "\n"))}, out, nil
}

// ---- validation helpers ----

func checkSandboxID(id string) error {
	if strings.TrimSpace(id) == "" {
		return invalid("sandbox_id is empty: give the id create_sandbox returned (list_sandboxes shows them)")
	}
	return nil
}

func checkPath(p string) error {
	if p == "" {
		return invalid("path is empty: give an absolute path inside the sandbox, e.g. /tmp/data.txt")
	}
	if !path.IsAbs(p) {
		return invalid("path %q is relative: give an absolute path inside the sandbox, e.g. /tmp/%s", p, p)
	}
	return nil
}

// ---- registration ----

func ptr[T any](v T) *T { return &v }

// schema infers T's JSON schema and lets edit refine it (enums, bounds,
// defaults). Inference fails only on a programming error.
func schema[T any](edit func(props map[string]*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: schema of %T: %v", *new(T), err))
	}
	// Arguments are never null: an optional one is left out. (Inference
	// makes pointer and slice fields nullable, which only confuses models.)
	for _, p := range s.Properties {
		if len(p.Types) == 2 && p.Types[0] == "null" {
			p.Type, p.Types = p.Types[1], nil
		}
	}
	if edit != nil {
		edit(s.Properties)
	}
	return s
}

func enum(s *jsonschema.Schema, def string, values ...string) {
	for _, v := range values {
		s.Enum = append(s.Enum, v)
	}
	if def != "" {
		s.Default = json.RawMessage(strconv.Quote(def))
	}
}

func bounds(s *jsonschema.Schema, lo, hi float64, def int64) {
	s.Minimum = ptr(lo)
	if hi > 0 {
		s.Maximum = ptr(hi)
	}
	if def != 0 {
		s.Default = json.RawMessage(strconv.FormatInt(def, 10))
	}
}

func nonEmpty(props map[string]*jsonschema.Schema, names ...string) {
	for _, n := range names {
		props[n].MinLength = ptr(1)
	}
}

func addTools(s *mcp.Server, t *tools) {
	lifetimeSchemas := func(p map[string]*jsonschema.Schema) {
		nonEmpty(p, "tag")
		bounds(p["timeout_seconds"], 0, 0, defaultLifetimeSeconds)
		bounds(p["idle_timeout_seconds"], 0, 0, 0)
		networkSchema(p["network"])
	}
	mcp.AddTool(s, &mcp.Tool{
		Name:  "create_sandbox",
		Title: "Create a sandbox",
		Description: "Create one sandbox (an isolated Linux microVM) by forking a warmed snapshot, in milliseconds. " +
			"Returns its id, which the other tools take as sandbox_id. Sandboxes live until timeout_seconds " +
			"(default 3600) or kill_sandbox; use list_snapshots to find a tag.",
		InputSchema: schema[CreateInput](lifetimeSchemas),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, t.createSandbox)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "fork_sandboxes",
		Title: "Fork several sandboxes",
		Description: "Create n identical sandboxes from one snapshot tag at once, e.g. to try several approaches in parallel " +
			"or to fork a state saved with branch_sandbox. Returns their ids.",
		InputSchema: schema[ForkInput](func(p map[string]*jsonschema.Schema) {
			lifetimeSchemas(p)
			bounds(p["n"], 1, 0, 0)
		}),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, t.forkSandboxes)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "run_command",
		Title: "Run a command",
		Description: "Run a process in a sandbox and wait for it: give argv (a program and its arguments, never passed through a shell) " +
			"or shell (a command line for /bin/sh -c). Returns the exit code, stdout and stderr (each cut to 64 KiB). " +
			"A non-zero exit code is reported in the result, not as an error. Default timeout 60 s.",
		InputSchema: schema[CommandInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id")
			bounds(p["timeout_seconds"], 1, maxTimeoutSeconds, defaultCommandTimeout)
			p["argv"].MinItems = ptr(1)
		}),
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, t.runCommand)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "run_code",
		Title: "Run Python code",
		Description: "Run Python code in a sandbox's persistent Python session (state persists between calls, like a notebook cell). " +
			"Returns stdout, stderr, the value of the last expression, and any exception with its traceback; " +
			"matplotlib figures and image results come back as images. Needs a snapshot with python=true. Default timeout 60 s.",
		InputSchema: schema[CodeInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id", "code")
			bounds(p["timeout_seconds"], 1, maxTimeoutSeconds, defaultCommandTimeout)
		}),
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false)},
	}, t.runCode)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "read_file",
		Title: "Read a file",
		Description: "Read a file from a sandbox. Text comes back as text, images (PNG, JPEG, GIF, WebP) as an image, " +
			"other binary data as base64. Reads at most max_bytes (default 1 MiB).",
		InputSchema: schema[ReadInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id", "path")
			enum(p["encoding"], "auto", "auto", "text", "base64")
			bounds(p["max_bytes"], 1, maxReadBytes, defaultReadBytes)
		}),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "write_file",
		Title: "Write a file",
		Description: "Create or replace a file in a sandbox (atomically), creating missing parent directories. " +
			"content is text, or base64 with encoding=base64 for binary data.",
		InputSchema: schema[WriteInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id", "path")
			enum(p["encoding"], "text", "text", "base64")
			p["mode"].Pattern = "^(0o?)?[0-7]{1,4}$"
			p["mode"].Default = json.RawMessage(`"0644"`)
			p["make_parents"].Default = json.RawMessage(`true`)
		}),
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_files",
		Title:       "List a directory",
		Description: "List the entries of a directory in a sandbox: name, type, size, permissions and modification time.",
		InputSchema: schema[ListInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id", "path")
		}),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, t.listFiles)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "branch_sandbox",
		Title: "Save a sandbox as a snapshot",
		Description: "Save the complete state of a running sandbox (memory, processes, files, Python variables) as a new snapshot tag, " +
			"without stopping it. Fork the tag later with create_sandbox or fork_sandboxes to continue from exactly this point, " +
			"e.g. to explore several alternatives from one checkpoint.",
		InputSchema: schema[BranchInput](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "sandbox_id", "tag")
			enum(p["mode"], "diff", "diff", "full", "live")
		}),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, t.branchSandbox)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_sandboxes",
		Title:       "List sandboxes",
		Description: "List sandboxes with their state, snapshot tag, expiry and metadata, optionally filtered by tag, state or metadata labels.",
		InputSchema: schema[ListSandboxesInput](func(p map[string]*jsonschema.Schema) {
			enum(p["state"], "", apiv1.SandboxStates...)
		}),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, t.listSandboxes)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "kill_sandbox",
		Title:       "Kill sandboxes",
		Description: "Stop sandboxes and free their resources. Their state is lost unless saved first with branch_sandbox.",
		InputSchema: schema[KillInput](nil),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, t.killSandbox)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "list_snapshots",
		Title: "List snapshots",
		Description: "List the snapshot tags sandboxes can be forked from, with their recipe, memory size and whether they " +
			"have Python for run_code (python=true).",
		InputSchema: schema[struct{}](nil),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, t.listSnapshots)
	addNetworkTools(s, t)
}
