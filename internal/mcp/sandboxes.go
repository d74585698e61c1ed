package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// Sandbox lifecycle: create_sandbox, fork_sandboxes, branch_sandbox,
// list_sandboxes and kill_sandbox.

// defaultLifetimeSeconds is a new sandbox's timeout when the call gives none.
const defaultLifetimeSeconds = 3600

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

// ---- create_sandbox, fork_sandboxes ----

// CreateInput is create_sandbox's arguments.
type CreateInput struct {
	Tag                string            `json:"tag" jsonschema:"snapshot tag to fork the sandbox from (see list_snapshots), or a registry reference HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST) that forkd push wrote: the daemon pulls it anonymously on first use"`
	PullPolicy         string            `json:"pull_policy,omitempty" jsonschema:"with a registry reference: if_not_present (the default: use the copy an earlier fork pulled) or always (pull when the registry's tag moved)"`
	TimeoutSeconds     *int64            `json:"timeout_seconds,omitempty" jsonschema:"lifetime in seconds: the sandbox is killed this long after creation (0: no limit, kill it yourself with kill_sandbox)"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_seconds,omitempty" jsonschema:"kill the sandbox after this many seconds without any request (0: no idle limit)"`
	Metadata           map[string]string `json:"metadata,omitempty" jsonschema:"labels to attach (string keys and values); list_sandboxes can filter on them"`
	Network            *NetworkInput     `json:"network,omitempty" jsonschema:"what the sandbox may reach: {mode: none|public|allow, allow: [...]}; absent: the snapshot's policy, else the daemon's default"`
}

// ForkInput is fork_sandboxes' arguments.
type ForkInput struct {
	Tag                string            `json:"tag" jsonschema:"snapshot tag to fork from (see list_snapshots), or a registry reference HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST), pulled anonymously on first use"`
	PullPolicy         string            `json:"pull_policy,omitempty" jsonschema:"with a registry reference: if_not_present (the default: use the copy an earlier fork pulled) or always (pull when the registry's tag moved)"`
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

// fork is both tools' fork: create_sandbox's is a ForkInput with N 1.
func (t *tools) fork(ctx context.Context, in ForkInput) (apiv1.ForkResponse, error) {
	if strings.TrimSpace(in.Tag) == "" {
		return apiv1.ForkResponse{}, invalid("tag is empty: give a snapshot tag (list_snapshots shows them) or a registry reference")
	}
	if err := checkTimeouts(in.TimeoutSeconds, in.IdleTimeoutSeconds); err != nil {
		return apiv1.ForkResponse{}, err
	}
	policy, err := networkPolicy(in.Network)
	if err != nil {
		return apiv1.ForkResponse{}, err
	}
	return t.b.Fork(ctx, apiv1.ForkRequest{
		Tag: in.Tag, Count: in.N, TimeoutSeconds: ptr(lifetime(in.TimeoutSeconds)), IdleTimeoutSeconds: in.IdleTimeoutSeconds,
		Metadata: in.Metadata, Network: policy, PullPolicy: in.PullPolicy,
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
	resp, err := t.fork(ctx, ForkInput{Tag: in.Tag, N: 1, PullPolicy: in.PullPolicy, TimeoutSeconds: in.TimeoutSeconds,
		IdleTimeoutSeconds: in.IdleTimeoutSeconds, Metadata: in.Metadata, Network: in.Network})
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
	resp, err := t.fork(ctx, in)
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

// ---- list_sandboxes, kill_sandbox ----

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

func addSandboxTools(s *mcp.Server, t *tools) {
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
}
