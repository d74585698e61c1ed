package apiv1

import "time"

// What the daemon says of itself (GET /v1/info) and what it streams
// (GET /v1/events).

// Info is GET /v1/info: what this daemon is and offers, so that clients
// (SDKs, dashboards, agents) read its capabilities instead of probing.
type Info struct {
	Version    string `json:"version"`
	APIVersion string `json:"api_version"`
	VMM        string `json:"vmm"`
	VMMVersion string `json:"vmm_version"`
	Accel      string `json:"accel"`
	// Features names what this daemon offers, sorted; see
	// docs/ARCHITECTURE.md for the list. A client checks for a name
	// rather than for a version.
	Features []string   `json:"features"`
	Limits   InfoLimits `json:"limits"`
	// Caller is who the daemon takes the caller for.
	Caller InfoCaller `json:"caller"`
	// Capacity is this host's room for sandboxes, for admin callers only
	// (a scheduler placing forks across hosts); absent for others.
	Capacity *InfoCapacity `json:"capacity,omitempty"`
}

// InfoCapacity is what a host has left for sandboxes, read when asked.
type InfoCapacity struct {
	// GuestMemoryCommittedBytes is the guest memory of the sandboxes
	// running and starting; GuestMemoryPooledBytes that of the pooled
	// VMMs, which a fork short of room evicts. A fork is refused (429)
	// when committed, pooled left and its own would pass
	// GuestMemoryLimitBytes (0: no limit).
	GuestMemoryCommittedBytes int64 `json:"guest_memory_committed_bytes"`
	GuestMemoryPooledBytes    int64 `json:"guest_memory_pooled_bytes"`
	GuestMemoryLimitBytes     int64 `json:"guest_memory_limit_bytes"`
	// HostMemory is the host's RAM (MemTotal) and what the kernel says
	// is available without swapping (MemAvailable).
	HostMemoryTotalBytes     int64 `json:"host_memory_total_bytes"`
	HostMemoryAvailableBytes int64 `json:"host_memory_available_bytes"`
	// Disk is the file system of the data dir: its size and the room an
	// unprivileged writer has left.
	DiskTotalBytes int64 `json:"disk_total_bytes"`
	DiskFreeBytes  int64 `json:"disk_free_bytes"`
	// SandboxesRunning counts the sandboxes running and starting (at
	// most limits' max_sandboxes, where set).
	SandboxesRunning int `json:"sandboxes_running"`
}

// InfoLimits are the daemon's limits and defaults that shape requests.
type InfoLimits struct {
	MaxForkCount int `json:"max_fork_count"`
	// MaxSandboxes bounds sandboxes running at once (0: no limit).
	MaxSandboxes      int   `json:"max_sandboxes"`
	MaxTimeoutSeconds int64 `json:"max_timeout_s"`
	// DefaultTimeoutSeconds is the lifetime of a sandbox whose fork names
	// none (0: no limit).
	DefaultTimeoutSeconds int64 `json:"default_timeout_s"`
	// DeadRetentionSeconds is how long a dead sandbox stays listed (0:
	// until killed).
	DeadRetentionSeconds int64 `json:"dead_retention_s"`
	// PoolSize is how many VMMs are kept ready per snapshot.
	PoolSize int `json:"pool_size"`
}

// InfoCaller is the caller's identity as the daemon sees it.
type InfoCaller struct {
	Tenant string `json:"tenant"`
	Role   string `json:"role"`
}

// Event is one lifecycle event of GET /v1/events: a sandbox created,
// killed, expired, died or discarded; a snapshot created or deleted; a
// background branch or an operation ended. Seq orders them (an SSE
// client resumes after the last one it saw with Last-Event-ID).
type Event struct {
	// ID names the event for resuming (Last-Event-ID, ?since=): the
	// daemon's epoch and Seq.
	ID   string    `json:"id,omitempty"`
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Type is the event's name: sandbox.created, sandbox.killed,
	// sandbox.expired, sandbox.died, sandbox.discarded, snapshot.created,
	// snapshot.deleted, snapshot.branch_ready, snapshot.branch_failed,
	// operation.finished; events.lost says events were dropped before
	// this stream could see them (Detail: the first and last lost seq).
	Type      string `json:"type"`
	Sandbox   string `json:"sandbox,omitempty"`
	Tag       string `json:"tag,omitempty"`
	Operation string `json:"operation,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	// Reason says why (a timeout, a VMM's exit, a branch's mode).
	Reason string `json:"reason,omitempty"`
	// Error is why a branch or operation failed.
	Error string `json:"error,omitempty"`
}

// EventsLost is the type of the event a stream starts with when events it
// asked for (Last-Event-ID) are no longer kept.
const EventsLost = "events.lost"
