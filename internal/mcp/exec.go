package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// Running code in a sandbox: run_command and run_code.

// Defaults and bounds of run_command's and run_code's arguments.
const (
	defaultCommandTimeout = 60
	maxTimeoutSeconds     = 3600
	// maxStreamOutput bounds each of stdout and stderr in a run_command
	// result (head and tail are kept): a model's context is the limit.
	maxStreamOutput = 64 << 10
)

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

func addExecTools(s *mcp.Server, t *tools) {
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
}
