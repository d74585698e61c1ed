// Package apiv1 holds the JSON wire types of forkd's HTTP API (version 1),
// shared by the daemon (internal/api) and its clients (internal/client, the
// CLI). It imports nothing from the engine, so clients never link it.
package apiv1

import (
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// Exec, file and code types are the agent's: the daemon proxies them.
type (
	ExecRequest   = agentapi.ExecRequest
	ExecEvent     = agentapi.ExecEvent
	FileInfo      = agentapi.FileInfo
	MkdirRequest  = agentapi.MkdirRequest
	RunCodeResult = agentapi.RunCodeResult
	CodeError     = agentapi.CodeError
	ProcessInfo   = agentapi.ProcessInfo
	SignalRequest = agentapi.SignalRequest
	PTY           = agentapi.PTY
	ResizeRequest = agentapi.ResizeRequest
)

// PidHeader carries the guest pid of an exec's process on the exec answer
// (streamed answers: with the 200; the first event, type start, carries it
// too). The pid names the process in /v1/sandboxes/{id}/processes/{pid}/….
const PidHeader = agentapi.PidHeader

// MaxPTYSize bounds each of a terminal's rows and cols (1..MaxPTYSize).
const MaxPTYSize = agentapi.MaxPTYSize

// ExecHeader carries the JSON ExecRequest on POST .../exec so the body can
// stream stdin.
const ExecHeader = agentapi.ExecHeader

// ExecResult is the buffered answer of exec (Accept: application/json).
// Output is bounded; the Truncated flags say when it was cut.
type ExecResult struct {
	// Pid is the process's guest pid (absent from an agent that predates
	// process control).
	Pid             int    `json:"pid,omitempty"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	DurationMicros  int64  `json:"duration_us,omitempty"`
}

// RunCodeEvent is one event of POST /v1/sandboxes/{id}/run_code/stream:
// stdout and stderr events carry output as it appears (Data, UTF-8 text),
// then exactly one result event (the code ran: success, exception or
// timeout; the result's stdout and stderr are empty, the output was
// streamed) or error event (it could not run to its end: a problem). A
// stream without either was cut. It is agentapi.RunCodeEvent with the
// daemon's problem (type, request id).
type RunCodeEvent struct {
	Type   string         `json:"type"`
	Data   string         `json:"data,omitempty"`
	Result *RunCodeResult `json:"result,omitempty"`
	Error  *Problem       `json:"error,omitempty"`
}

// Version answers GET /v1/version.
type Version struct {
	Version    string `json:"version"`
	GoVersion  string `json:"go_version"`
	VMM        string `json:"vmm"`
	VMMVersion string `json:"vmm_version"`
	Accel      string `json:"accel"`
	DataDir    string `json:"data_dir"`
}

// Image is a built guest image.
type Image struct {
	Digest        string    `json:"digest"`
	Recipe        string    `json:"recipe"`
	KernelVersion string    `json:"kernel_version"`
	MemoryMiB     int       `json:"memory_mib"`
	VCPUs         int       `json:"vcpus"`
	SizeBytes     int64     `json:"size_bytes"`
	Created       time.Time `json:"created"`
	Dir           string    `json:"dir"`
	// From is the OCI image reference of a recipe with from, FromDigest
	// the manifest digest it resolved to.
	From       string `json:"from,omitempty"`
	FromDigest string `json:"from_digest,omitempty"`
}

// BuildImageRequest is POST /v1/images.
type BuildImageRequest struct {
	BuildSource
}

// BuildSource is what an image is built from, in a build request and in
// a snapshot create (which builds its image first).
type BuildSource struct {
	// Recipe names a recipe the daemon knows (recipes/NAME.toml);
	// RecipeTOML is a recipe file's contents; From is an OCI image
	// reference to build from with forkd's defaults. Exactly one is set.
	Recipe     string `json:"recipe,omitempty"`
	RecipeTOML string `json:"recipe_toml,omitempty"`
	From       string `json:"from,omitempty"`
	// InsecureRegistry, with From (or a recipe's or Dockerfile's
	// FROM), allows a plain-HTTP registry or an untrusted TLS certificate.
	InsecureRegistry bool `json:"insecure_registry,omitempty"`
	// Dockerfile is a Dockerfile's contents, instead of the above: its
	// FROM, RUN, COPY and ADD of local files, ENV, WORKDIR, USER, ARG, CMD
	// and ENTRYPOINT are built in microVMs (anything else is refused,
	// naming the line).
	// Name is the image's recipe name ("dockerfile" if empty); BuildArgs
	// override its ARG defaults.
	Dockerfile string            `json:"dockerfile,omitempty"`
	Name       string            `json:"name,omitempty"`
	BuildArgs  map[string]string `json:"build_args,omitempty"`
	// Context holds the build context's files that a recipe's files or a
	// Dockerfile's COPY and ADD name, by path relative to the context.
	Context []ContextFile `json:"context,omitempty"`
	// BuildNetwork is the egress policy of the build VMs that run RUN
	// steps; absent: the daemon's default (its --network).
	BuildNetwork *NetworkPolicy `json:"build_network,omitempty"`
	// RegistryUsername and RegistryPassword authenticate the pull of the
	// image built from (from, a Dockerfile's or recipe's FROM). A
	// tenant's build uses only these, never the daemon's docker logins;
	// an admin's without them uses the daemon's.
	RegistryUsername string `json:"registry_username,omitempty"`
	RegistryPassword string `json:"registry_password,omitempty"`
}

// ContextFile is one file of a build context.
type ContextFile struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"` // permission bits, 0o755 for an executable
	Data []byte `json:"data"` // base64 in JSON
}

// CreateSnapshotRequest is POST /v1/snapshots.
type CreateSnapshotRequest struct {
	Tag string `json:"tag"`
	// BuildSource is what the snapshot's image is built from (or found
	// cached): a recipe, an OCI image or a Dockerfile.
	BuildSource
	// Warm overrides the recipe's Python warm-up code when non-empty.
	Warm      string `json:"warm,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"` // 0: the recipe's
	VCPUs     int    `json:"vcpus,omitempty"`      // 0: the recipe's
	// Network is the egress policy the snapshot's children inherit
	// unless their fork names one; absent: the daemon's default.
	Network *NetworkPolicy `json:"network,omitempty"`
}

// Snapshot describes a snapshot tag.
type Snapshot struct {
	Tag         string    `json:"tag"`
	ID          string    `json:"id"`
	Created     time.Time `json:"created"`
	Recipe      string    `json:"recipe"`
	ImageDigest string    `json:"image_digest"`
	VMM         string    `json:"vmm"`
	VMMVersion  string    `json:"vmm_version"`
	Accel       string    `json:"accel"`
	MemoryMiB   int       `json:"memory_mib"`
	VCPUs       int       `json:"vcpus"`
	// CPUs is the default CPU limit of its sandboxes (its recipe's cpus);
	// absent: one CPU per vCPU plus half a CPU for the VMM.
	CPUs         float64              `json:"cpus,omitempty"`
	Python       bool                 `json:"python"`
	Files        map[string]FileEntry `json:"files"`
	SizeBytes    int64                `json:"size_bytes"` // logical
	DiskBytes    int64                `json:"disk_bytes"` // allocated (memory images are sparse)
	CreateMillis int64                `json:"create_ms"`
	Pooled       int                  `json:"pooled_vmms"` // pre-started VMM processes waiting
	// State is SnapshotReady, or SnapshotWriting while a branch made with
	// no_wait is still being written, or SnapshotFailed (Error says why).
	// Only a ready snapshot can be forked.
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Chain: a diff layer names its parent; Depth counts the layers above
	// a self-contained snapshot (0 for a flat one). Ancestors run from the
	// parent to the root; Dependents are the tags whose chains need this one.
	Parent     *ParentRef `json:"parent,omitempty"`
	Depth      int        `json:"depth"`
	Ancestors  []string   `json:"ancestors,omitempty"`
	Dependents []string   `json:"dependents,omitempty"`
	// Owner is the tenant that owns the tag ("default" for tags made
	// before tenants existed). SharedWith are the other tenants it is
	// shared with, read-only ("*": every tenant); shown to the owner and
	// to admins only.
	Owner      string   `json:"owner,omitempty"`
	SharedWith []string `json:"shared_with,omitempty"`
}

// Snapshot states.
const (
	SnapshotReady   = "ready"
	SnapshotWriting = "writing"
	SnapshotFailed  = "failed"
)

// ParentRef names a layer's parent snapshot by tag and by the digest of its
// manifest, so that a parent replaced under the same tag is detected.
type ParentRef struct {
	Tag    string `json:"tag"`
	Digest string `json:"digest"`
}

// FileEntry is one file of a snapshot.
type FileEntry struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// SandboxPatch is PATCH /v1/sandboxes/{id}: a running sandbox's new
// lifetime. Absent fields stay as they are.
type SandboxPatch struct {
	// TimeoutSeconds ends the sandbox this long from now (0: never),
	// whatever its timeout was: E2B's set_timeout.
	TimeoutSeconds *int64 `json:"timeout_s,omitempty"`
	// IdleTimeoutSeconds is its new idle timeout (0: none).
	IdleTimeoutSeconds *int64 `json:"idle_timeout_s,omitempty"`
}

// ForkRequest is POST /v1/sandboxes: N children of a snapshot tag.
type ForkRequest struct {
	// Tag is a local snapshot tag, or a registry reference
	// (host[:port]/repository:tag or @sha256:..., as `forkd push` wrote
	// it) that the daemon pulls for the caller's tenant as PullPolicy
	// says, under a tag of forkd's reserved namespace (ref--...).
	Tag   string `json:"tag"`
	Count int    `json:"count"`
	// PullPolicy is when a fork by reference pulls: PullIfNotPresent
	// (absent: the default) or PullAlways. Only with a reference.
	PullPolicy string `json:"pull_policy,omitempty"`
	// RegistryUsername and RegistryPassword authenticate a fork by
	// reference's pull (the CLI sends its docker config's credentials);
	// without them it is anonymous. Only with a reference.
	RegistryUsername string `json:"registry_username,omitempty"`
	RegistryPassword string `json:"registry_password,omitempty"`
	// TimeoutSeconds ends each sandbox this long after it was created;
	// 0: no limit; absent: the daemon's default (forkd serve
	// --sandbox-timeout, one hour unless set).
	TimeoutSeconds *int64 `json:"timeout_s,omitempty"`
	// IdleTimeoutSeconds ends a sandbox that received no request (exec,
	// files, run_code) for this long (0: no limit).
	IdleTimeoutSeconds int64 `json:"idle_timeout_s,omitempty"`
	// Metadata labels every sandbox of the request; list filters on them.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Network is the children's egress policy; absent: the snapshot's,
	// or the daemon's default.
	Network *NetworkPolicy `json:"network,omitempty"`
	// CPUs caps each child's CPU (0.5: half a CPU), from 0.1 to the
	// snapshot's vCPUs; absent: one CPU per vCPU plus half a CPU for the
	// VMM.
	CPUs float64 `json:"cpus,omitempty"`
}

// Pull policies of a fork by registry reference (ForkRequest.PullPolicy),
// as Kubernetes' imagePullPolicy.
const (
	// PullIfNotPresent forks the copy the tenant holds, pulled by an
	// earlier fork of the same reference, without asking the registry; it
	// pulls only when there is none. A moved registry tag is not seen
	// until PullAlways (a digest reference never moves).
	PullIfNotPresent = "if_not_present"
	// PullAlways asks the registry for the reference's digest at each
	// fork (a manifest HEAD, no blob) and pulls when it differs from the
	// held copy's.
	PullAlways = "always"
)

// PullPolicies are the pull policies, the default first.
var PullPolicies = []string{PullIfNotPresent, PullAlways}

// Port is where a sandbox's TCP port is served (GET
// /v1/sandboxes/{id}/ports/{port}): Path on the API, and Host when the
// daemon routes PORT-ID.DOMAIN (serve --port-domain).
type Port struct {
	Port int    `json:"port"`
	Path string `json:"path"`
	Host string `json:"host,omitempty"`
}

// NetworkPolicy is what a sandbox may reach: mode "none" (nothing),
// "public" (the internet, never the host, other sandboxes, private,
// CGNAT, link-local or multicast ranges), or "allow" with Allow listing
// networks ("198.51.100.0/24", "203.0.113.7:443/tcp", ports as
// "8000-8099") and domain names ("example.com", "*.example.com").
type NetworkPolicy struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow,omitempty"`
	// MaxConnections caps the TCP connections the sandbox has open through
	// its uplink at once; RateMbit its traffic each way (0: no cap).
	MaxConnections int `json:"max_connections,omitempty"`
	RateMbit       int `json:"rate_mbit,omitempty"`
}

// SandboxNetwork is a sandbox's policy and traffic (PUT and GET
// /v1/sandboxes/{id}/network).
type SandboxNetwork struct {
	Policy NetworkPolicy `json:"policy"`
	Stats  *NetworkStats `json:"stats,omitempty"`
}

// NetworkStats counts what crossed a sandbox's link since it was set up.
type NetworkStats struct {
	TxBytes        uint64 `json:"tx_bytes"`
	RxBytes        uint64 `json:"rx_bytes"`
	TxPackets      uint64 `json:"tx_packets"`
	RxPackets      uint64 `json:"rx_packets"`
	DeniedPackets  uint64 `json:"denied_packets"`
	SpoofedPackets uint64 `json:"spoofed_packets"`
}

// ForkResponse lists the new sandboxes, every one answering.
type ForkResponse struct {
	Sandboxes   []Sandbox `json:"sandboxes"`
	TotalMillis float64   `json:"total_ms"`
}

// Sandbox states.
const (
	// StateStarting: a child of a fork that has not answered yet (its
	// agent answers; its siblings may not). It becomes running when the
	// fork answers, or is discarded if the daemon dies before.
	StateStarting = "starting"
	StateRunning  = "running"
	StateDead     = "dead"    // the VMM exited on its own; see DeadReason
	StateStopped  = "stopped" // killed on request
)

// SandboxStates lists every sandbox state, for filters and metrics.
var SandboxStates = []string{StateStarting, StateRunning, StateDead, StateStopped}

// Sandbox describes one sandbox.
type Sandbox struct {
	ID      string    `json:"id"`
	Tag     string    `json:"tag"`
	State   string    `json:"state"`
	Created time.Time `json:"created"`
	// ReadyMillis is fork-to-ready: from taking a VMM to the agent answering.
	ReadyMillis float64 `json:"ready_ms"`
	// Pooled is true when a pre-started VMM process was used.
	Pooled bool `json:"pooled"`
	// Rehearsed is true when that VMM was restored ahead in the pool and
	// rehearsed a first request there (in a throwaway copy of the Python
	// session; without one, an exec of `true`), so the child's first
	// request runs warm.
	Rehearsed  bool   `json:"rehearsed,omitempty"`
	PID        int    `json:"pid,omitempty"`
	NetNS      string `json:"netns,omitempty"`
	GuestIP    string `json:"guest_ip,omitempty"`
	DeadReason string `json:"dead_reason,omitempty"`
	// Metadata are the labels given at fork.
	Metadata map[string]string `json:"metadata,omitempty"`
	// ExpiresAt is when the sandbox's absolute timeout ends it (zero: never).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// EndedAt is when a dead sandbox was found dead; it leaves the list
	// the daemon's retention period (--dead-retention) later.
	EndedAt *time.Time `json:"ended_at,omitempty"`
	// IdleTimeoutSeconds ends the sandbox after that long without requests.
	IdleTimeoutSeconds int64     `json:"idle_timeout_s,omitempty"`
	LastActivity       time.Time `json:"last_activity"`
	// ConsoleTail is the end of the guest console, for dead sandboxes.
	ConsoleTail string `json:"console_tail,omitempty"`
	// Network is the sandbox's egress policy (and, for one sandbox, its
	// traffic).
	Network *SandboxNetwork `json:"network,omitempty"`
	// Tenant is the tenant whose token forked the sandbox ("default" for
	// sandboxes forked before tenants existed).
	Tenant string `json:"tenant,omitempty"`
	// CPUs is the CPU limit the fork asked for (ForkRequest.CPUs); absent:
	// the default, one CPU per vCPU plus half a CPU for the VMM.
	CPUs float64 `json:"cpus,omitempty"`
}

// BranchRequest is POST /v1/sandboxes/{id}/branch: snapshot a running
// sandbox into a new tag.
type BranchRequest struct {
	Tag  string `json:"tag"`
	Mode string `json:"mode,omitempty"` // diff (default), full, live
	// NoWait (live mode) answers as soon as the source runs again, with the
	// snapshot in state "writing"; poll GET /v1/snapshots/{tag} for
	// "ready" or "failed".
	NoWait bool `json:"no_wait,omitempty"`
}

// BranchResponse describes the new snapshot and what the branch cost the
// source sandbox.
type BranchResponse struct {
	Snapshot     Snapshot `json:"snapshot"`
	PauseMillis  float64  `json:"pause_ms"`
	BytesWritten int64    `json:"bytes_written"`
	TotalMillis  float64  `json:"total_ms"`
	// Operation is the background branch writing the tag (no_wait).
	Operation *Operation `json:"operation,omitempty"`
}

// CompactRequest is POST /v1/snapshots/{tag}/compact: a flat copy of a
// chain head under the tag To.
type CompactRequest struct {
	To string `json:"to"`
}

// PullSnapshotRequest is POST /v1/snapshots/pull: fetch a snapshot
// artifact (`forkd push`) from an OCI registry into this daemon's data
// directory, verified under its import policy.
type PullSnapshotRequest struct {
	// Ref is host[:port]/repository:tag (or @sha256:...).
	Ref string `json:"ref"`
	// Tag, if set, is the local tag instead of the snapshot's own.
	Tag string `json:"tag,omitempty"`
	// Force replaces existing tags (admin only), as an import does.
	Force bool `json:"force,omitempty"`
	// VerifyKey refuses an artifact not signed by this ed25519 public key
	// (base64 of its 32 bytes), on top of the daemon's trusted keys.
	VerifyKey string `json:"verify_key,omitempty"`
	// PlainHTTP allows plain HTTP to a registry not on loopback.
	PlainHTTP bool `json:"plain_http,omitempty"`
	// Username and Password authenticate to the registry (the CLI sends
	// its docker config's credentials); without them the daemon uses its
	// own docker config.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// RemovedSnapshots answers DELETE /v1/snapshots/{tag}: the tags removed,
// the layers of a cascade first (deepest first), the tag asked for last.
type RemovedSnapshots struct {
	Removed []string `json:"removed"`
}

// KillRequest is POST /v1/sandboxes:kill.
type KillRequest struct {
	IDs []string `json:"ids,omitempty"`
	All bool     `json:"all,omitempty"`
}

// KillResponse lists what was killed.
type KillResponse struct {
	Killed []string `json:"killed"`
}

// RunCodeRequest is POST /v1/sandboxes/{id}/run_code.
type RunCodeRequest struct {
	Code          string `json:"code"`
	TimeoutMillis int64  `json:"timeout_ms,omitempty"`
}

// Check is one `forkd doctor` finding.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Progress is one line of a long-running request's NDJSON response
// (image build, snapshot create). The last line has Result or Error.
type Progress struct {
	Message string   `json:"message,omitempty"`
	Error   *Problem `json:"error,omitempty"`
	// Exactly one of these is set on the final line, matching the request.
	Image    *Image    `json:"image,omitempty"`
	Snapshot *Snapshot `json:"snapshot,omitempty"`
}

// Problem is an RFC 9457 problem+json body. Code is the stable errdefs class.
type Problem struct {
	Type      string `json:"type,omitempty"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	RequestID string `json:"request_id,omitempty"`
}
