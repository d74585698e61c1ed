package mcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// Snapshots: list_snapshots. (branch_sandbox, which makes one from a
// running sandbox, is with the sandbox tools.)

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

func addSnapshotTools(s *mcp.Server, t *tools) {
	mcp.AddTool(s, &mcp.Tool{
		Name:  "list_snapshots",
		Title: "List snapshots",
		Description: "List the snapshot tags sandboxes can be forked from, with their recipe, memory size and whether they " +
			"have Python for run_code (python=true).",
		InputSchema: schema[struct{}](nil),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, t.listSnapshots)
}
