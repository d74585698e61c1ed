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
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Files in a sandbox: read_file, write_file and list_files.

// Defaults and bounds of read_file's arguments.
const (
	defaultReadBytes = 1 << 20
	maxReadBytes     = 16 << 20
)

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

func addFileTools(s *mcp.Server, t *tools) {
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
}
