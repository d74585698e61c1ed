package apiv1

import (
	"encoding/json"
	"time"
)

// Operation states. Running is the only state that changes; the others
// are terminal.
const (
	OpRunning   = "running"
	OpSucceeded = "succeeded"
	OpFailed    = "failed"
	OpCancelled = "cancelled"
)

// Operation kinds.
const (
	OpImageBuild      = "image.build"
	OpSnapshotCreate  = "snapshot.create"
	OpSnapshotCompact = "snapshot.compact"
	OpSandboxBranch   = "sandbox.branch"
	OpSnapshotPull    = "snapshot.pull"
)

// Operation is daemon-owned work that outlives the request that started
// it (an image build, a snapshot create, a compact, a no-wait branch):
// POST answers 202 with it (Location: /v1/operations/{id}), GET
// /v1/operations/{id} polls it, GET /v1/operations/{id}/events follows
// it, POST /v1/operations/{id}/cancel cancels it.
type Operation struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`   // Op* kinds
	Target string `json:"target"` // the recipe, or the tag being written
	State  string `json:"state"`
	// CancelRequested is set once a cancel was asked for; the state
	// becomes cancelled when the work has unwound.
	CancelRequested bool      `json:"cancel_requested,omitempty"`
	Created         time.Time `json:"created"`
	Updated         time.Time `json:"updated"`
	// Progress are the latest progress lines (at most 1000, oldest
	// dropped first).
	Progress []string `json:"progress"`
	// DoneBytes and TotalBytes are the current step's byte progress,
	// where the step knows it (0: unknown).
	DoneBytes  int64 `json:"done_bytes,omitempty"`
	TotalBytes int64 `json:"total_bytes,omitempty"`
	// Result is set on success: an Image for image.build, a Snapshot for
	// snapshot.create and snapshot.compact, a BranchResponse for
	// sandbox.branch.
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Problem        `json:"error,omitempty"`
	// Tenant started the operation; only it (and admins) see it.
	Tenant string `json:"tenant,omitempty"`
}

// Terminal reports whether the operation has ended.
func (o Operation) Terminal() bool { return o.State != OpRunning && o.State != "" }

// Operation event types (GET /v1/operations/{id}/events).
const (
	// OpEventState carries the whole operation: first on every stream
	// (so a client that re-attaches starts from the current state), and
	// last, with the terminal state, before the stream ends.
	OpEventState = "state"
	// OpEventProgress is one progress line, or byte progress of the
	// current step (DoneBytes/TotalBytes), or both.
	OpEventProgress = "progress"
)

// OperationEvent is one line of GET /v1/operations/{id}/events (NDJSON,
// or Server-Sent Events with Accept: text/event-stream).
type OperationEvent struct {
	Type       string     `json:"type"`
	Operation  *Operation `json:"operation,omitempty"`
	Message    string     `json:"message,omitempty"`
	DoneBytes  int64      `json:"done_bytes,omitempty"`
	TotalBytes int64      `json:"total_bytes,omitempty"`
}

// Headers of long operations and retried requests.
const (
	// IdempotencyKeyHeader makes a retried POST /v1/sandboxes,
	// /v1/snapshots or /v1/images return the first request's result.
	IdempotencyKeyHeader = "Idempotency-Key"
	// IdempotentReplayedHeader is "true" on an answer replayed for a key.
	IdempotentReplayedHeader = "Idempotent-Replayed"
	// OperationHeader names the operation behind a synchronous answer
	// (a snapshot create's progress stream), to re-attach to it.
	OperationHeader = "X-Forkd-Operation"
	// PreferAsync, in a Prefer header (RFC 7240), asks a long request to
	// answer 202 with its operation at once (or ?async=true).
	PreferAsync = "respond-async"
)
