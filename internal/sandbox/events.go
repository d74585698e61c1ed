package sandbox

// Event is a lifecycle event the engine reports, as it happens, for the
// audit log and the API's event stream (GET /v1/events): a sandbox was
// created, killed, expired, died or discarded; a snapshot was created or
// deleted; a background branch ended.
type Event struct {
	Kind      string
	SandboxID string
	// Tag is the snapshot the event is about (a sandbox's own snapshot,
	// a branch's, a created or deleted one).
	Tag string
	// Tenant owns the sandbox ("" for a snapshot event: the API knows
	// snapshot owners).
	Tenant string
	Reason string
	// Err is why a branch failed (EventBranchFailed).
	Err error
}

// Event kinds.
const (
	// EventCreated: a fork answered with the sandbox.
	EventCreated = "sandbox.created"
	// EventKilled: killed on request.
	EventKilled  = "sandbox.killed"
	EventDied    = "sandbox.died"
	EventExpired = "sandbox.expired"
	// EventDiscarded: at start, a sandbox recorded by a fork that had not
	// answered when the daemon stopped was killed and forgotten.
	EventDiscarded = "sandbox.discarded"
	// EventBranchReady and EventBranchFailed: a background (--no-wait)
	// branch ended; its request was answered 202 long before.
	EventBranchReady  = "snapshot.branch_ready"
	EventBranchFailed = "snapshot.branch_failed"
	// EventSnapshotCreated: a snapshot was created (a template, a branch
	// that waited, a compaction); EventSnapshotDeleted: one was removed.
	EventSnapshotCreated = "snapshot.created"
	EventSnapshotDeleted = "snapshot.deleted"
)

// emit tells Config.OnEvent, if set, about ev.
func (e *Engine) emit(ev Event) {
	if e.cfg.OnEvent != nil {
		e.cfg.OnEvent(ev)
	}
}
