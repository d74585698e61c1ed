package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// The tools, one file per group, each registering its tools next to their
// handlers: sandboxes.go (create_sandbox, fork_sandboxes, branch_sandbox,
// list_sandboxes, kill_sandbox), exec.go (run_command, run_code), files.go
// (read_file, write_file, list_files), snapshots.go (list_snapshots) and
// network.go (expose_port). This file holds what they share.

// tools holds the tool handlers.
type tools struct {
	b    Backend
	opts Options
}

// ---- results and errors ----

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

// imageTypes are the MIME types returned as MCP image content (decoded
// from the base64 the Python session sends).
var imageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// isImageType reports whether mt is returned as MCP image content.
func isImageType(mt string) bool {
	for _, it := range imageTypes {
		if mt == it {
			return true
		}
	}
	return false
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

// addTools registers every tool on s.
func addTools(s *mcp.Server, t *tools) {
	addSandboxTools(s, t)
	addExecTools(s, t)
	addFileTools(s, t)
	addSnapshotTools(s, t)
	addNetworkTools(s, t)
}
