// Package agentapi is the wire contract between the host (forkd) and the guest
// agent (forkd-agent, PID 1 in every microVM).
//
// # Transport
//
// The agent listens on one byte stream: a virtio-serial port (/dev/vport0p1,
// named "agent") under QEMU, a vsock connection under Firecracker later. The
// stream is transport-agnostic; everything above it is identical.
//
// A session starts with a line handshake, so that a VM restored from a
// snapshot (whose agent remembers a session with a host that no longer
// exists) can be re-attached by a new host:
//
//	host  -> agent: "FORKD-HELLO " + JSON(Hello) + "\n"
//	agent -> host : "FORKD-READY " + JSON(Ready) + "\n"
//
// Both sides discard any bytes before their expected prefix (frames left over
// from a previous session). After the handshake both run yamux over the stream
// (host = client, agent = server) and every yamux stream carries HTTP/1.1, so
// requests are concurrent and multiplexed, and bodies stream in both
// directions. The agent applies the Hello's identity (clock, entropy, hostname,
// Python reseed) before it answers READY: no request can observe the
// template's identity.
//
// A host that wants to snapshot the VM calls Quiesce; the agent stops serving
// requests on the session, sends a yamux GoAway (the host must open no new
// stream), then answers (Connection: close), ends its yamux session and waits
// for a new HELLO. Nothing the host sends after reading the answer is served. If the host goes away (the stream reads EOF), the
// agent waits for a new HELLO too. A HELLO may also arrive while the agent
// still runs a session, e.g. in a VM restored from a snapshot taken without
// Quiesce, or when a new host connected before the agent saw the old one
// leave: the agent checks every yamux frame header it receives, and bytes
// that cannot be one (a HELLO starts with 'F'; yamux headers with version 0)
// end the session and are scanned for the HELLO. The Hello's Nonce, echoed in
// Ready, lets the host skip READY lines that are not its own. A host that gets
// no READY within a second resynchronizes: it sends zero bytes (more than the
// largest yamux frame the agent accepts, which completes a frame cut short by
// a snapshot; a header of zeros is invalid) and a new HELLO with a new nonce.
package agentapi

import "time"

// Handshake line prefixes.
const (
	HelloPrefix = "FORKD-HELLO "
	ReadyPrefix = "FORKD-READY "
)

// Version of this wire contract; the agent reports it in Ready and Info.
const Version = 1

// VsockPort is the vsock port the agent listens on in a VM whose channel
// is vsock (Firecracker's hybrid vsock: the host sends "CONNECT 1024").
const VsockPort = 1024

// Paths of the agent's HTTP API (served on each yamux stream).
const (
	PathInfo        = "/v1/info"            // GET -> Info
	PathIdentity    = "/v1/identity"        // POST Identity -> Info (re-apply identity without a new session)
	PathExec        = "/v1/exec"            // POST: header ExecHeader (JSON ExecRequest), body = stdin stream; response NDJSON ExecEvent stream
	PathFiles       = "/v1/files"           // GET ?path= -> raw bytes; PUT ?path=&mode=0644 body raw -> FileInfo; DELETE ?path=&recursive=1
	PathFilesList   = "/v1/files/list"      // GET ?path= -> []FileInfo
	PathFilesStat   = "/v1/files/stat"      // GET ?path= -> FileInfo
	PathFilesMkdir  = "/v1/files/mkdir"     // POST MkdirRequest -> FileInfo
	PathPythonStart = "/v1/python/start"    // POST PythonStartRequest -> PythonStartResponse
	PathRunCode     = "/v1/run_code"        // POST RunCodeRequest -> RunCodeResult
	PathRehearse    = "/v1/python/rehearse" // POST RehearseRequest -> {} (runs code in a throwaway copy of the session)
	PathQuiesce     = "/v1/quiesce"         // POST -> {} ; agent then ends the session and awaits a new HELLO
	PathShutdown    = "/v1/shutdown"        // POST -> {} ; agent syncs and powers the VM off
	PathProcesses   = "/v1/processes"       // GET -> []ProcessInfo (running execs); see ProcessStdinPath, ProcessSignalPath
	// PathChanges streams what the guest changed in its root file system
	// as an uncompressed OCI layer tar (GET; 412 without an overlay root).
	// Image builds read it from build VMs (internal/guest/changes).
	PathChanges = "/v1/changes"
)

// ProcessStdinPath is where raw bytes are appended to the stdin of the exec
// with guest pid pid (POST, body = the bytes; ?close=1 closes stdin after
// them) -> 204. Only an exec started with StdinOpen accepts it.
func ProcessStdinPath(pid int) string { return PathProcesses + "/" + itoa(pid) + "/stdin" }

// ProcessSignalPath is where a signal is sent to the process group of the
// exec with guest pid pid (POST SignalRequest) -> 204.
func ProcessSignalPath(pid int) string { return PathProcesses + "/" + itoa(pid) + "/signal" }

// ProcessResizePath is where the terminal of the exec with guest pid pid
// (one started with ExecRequest.PTY) is resized (POST ResizeRequest) ->
// 204; the kernel sends SIGWINCH to the terminal's foreground group. An
// exec without a terminal answers failed_precondition.
func ProcessResizePath(pid int) string { return PathProcesses + "/" + itoa(pid) + "/resize" }

// PidHeader is set on the 200 of PathExec: the guest pid of the process,
// the handle for PathProcesses and its sub-paths. It is the pid of the
// process started (the shell for ExecRequest.Shell), which leads its own
// process group.
const PidHeader = "X-Forkd-Pid"

// itoa formats a non-negative int without strconv (this package imports
// nothing but time).
func itoa(n int) string {
	if n <= 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// itoaSigned is itoa for any int.
func itoaSigned(n int) string {
	if n < 0 {
		return "-" + itoa(-n)
	}
	return itoa(n)
}

// ExecHeader carries the JSON ExecRequest for PathExec, so the body can be
// the process's stdin stream.
const ExecHeader = "X-Forkd-Exec"

// Identity is what makes a restored VM a distinct sandbox. It is sent in every
// Hello and applied before the agent answers.
type Identity struct {
	SandboxID string `json:"sandbox_id"`
	Hostname  string `json:"hostname"`
	// UnixNano is the host's wall clock; the guest's clock is set to it.
	UnixNano int64 `json:"unix_nano"`
	// Entropy is fresh random bytes from the host (>= 32): mixed into the
	// kernel RNG (RNDADDENTROPY + RNDRESEEDCRNG) and used to reseed the Python
	// session's random and numpy generators.
	Entropy []byte `json:"entropy"`
}

// Hello starts a session.
type Hello struct {
	Identity Identity `json:"identity"`
	// Nonce is echoed in Ready, so a host never mistakes a READY line left
	// over from an earlier handshake (or one inside stale frames) for the
	// answer to its own Hello. agentconn.Dial fills it in when empty.
	Nonce string `json:"nonce,omitempty"`
}

// Ready answers a Hello.
type Ready struct {
	Info  Info   `json:"info"`
	Nonce string `json:"nonce,omitempty"` // the Hello's Nonce
	// Error is set when the agent could not apply the Hello (for example an
	// identity it refuses); no session follows and the agent keeps waiting
	// for another Hello.
	Error string `json:"error,omitempty"`
}

// Info describes the agent and its VM.
type Info struct {
	AgentVersion    string `json:"agent_version"`
	ProtocolVersion int    `json:"protocol_version"`
	SandboxID       string `json:"sandbox_id"`
	Hostname        string `json:"hostname"`
	Kernel          string `json:"kernel"`
	UptimeMillis    int64  `json:"uptime_ms"`
	// Python is true while a persistent Python session is running.
	Python bool `json:"python"`
	// IdentityApplyMicros is how long applying the last identity took.
	IdentityApplyMicros int64 `json:"identity_apply_us"`
	// Features names what this agent does beyond protocol Version's base
	// (AgentFeatures): a host asks before it relies on one, since a
	// sandbox forked from an old snapshot runs the agent of its day, which
	// would ignore a field it does not know.
	Features []string `json:"features,omitempty"`
}

// Agent features (Info.Features).
const (
	// FeaturePTY: ExecRequest.PTY and ProcessResizePath.
	FeaturePTY = "pty"
)

// AgentFeatures is what an agent of this build offers.
var AgentFeatures = []string{FeaturePTY}

// ExecRequest starts a process. Exactly one of Argv or Shell is set; Shell is
// run as /bin/sh -c SHELL.
type ExecRequest struct {
	Argv  []string          `json:"argv,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	// User runs the process as NAME, UID, NAME:GROUP or UID:GID, looked
	// up in the guest's /etc/passwd and /etc/group (HOME follows the
	// user's unless Env sets it); "": the image's user (ImageConfig.User),
	// else root.
	User string `json:"user,omitempty"`
	// TimeoutMillis > 0 kills the whole process group when it elapses.
	TimeoutMillis int64 `json:"timeout_ms,omitempty"`
	// Stdin true: the request body is streamed to the process's stdin (EOF
	// closes it, unless StdinOpen). false: stdin is /dev/null, unless
	// StdinOpen.
	Stdin bool `json:"stdin,omitempty"`
	// StdinOpen keeps the process's stdin open after the request body (if
	// any) ends: more is written with ProcessStdinPath, which also closes
	// it; it is closed when the process exits.
	StdinOpen bool `json:"stdin_open,omitempty"`
	// PTY runs the process on a new pseudo-terminal of this size: in a
	// new session (setsid) with the terminal as its controlling tty and as
	// fds 0, 1 and 2, TERM from Env or else "xterm-256color". All output
	// arrives as EventStdout (a terminal merges the streams). Input is
	// what a keyboard types (0x03 interrupts the foreground group); the
	// end of input (the body's EOF without StdinOpen, a close, or no
	// Stdin and no StdinOpen at all) types the terminal's EOF character
	// (^D) once, and the process runs on.
	PTY *PTY `json:"pty,omitempty"`
}

// PTY is the size of an exec's terminal, in character cells.
type PTY struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// MaxPTYSize bounds each of a terminal's rows and cols (1..MaxPTYSize).
const MaxPTYSize = 1000

// Check returns why the size is not valid ("pty cols 0: want 1..1000"),
// or "" if it is.
func (p PTY) Check() string {
	if p.Rows < 1 || p.Rows > MaxPTYSize {
		return "pty rows " + itoaSigned(p.Rows) + ": want 1.." + itoa(MaxPTYSize)
	}
	if p.Cols < 1 || p.Cols > MaxPTYSize {
		return "pty cols " + itoaSigned(p.Cols) + ": want 1.." + itoa(MaxPTYSize)
	}
	return ""
}

// ResizeRequest is the body of ProcessResizePath: the terminal's new size
// (each of rows and cols 1..MaxPTYSize).
type ResizeRequest = PTY

// ProcessInfo describes a running exec (PathProcesses). An exec is listed
// from its start until its process exits.
type ProcessInfo struct {
	Pid   int      `json:"pid"`
	Argv  []string `json:"argv"` // as run: /bin/sh -c SHELL for a Shell request
	Shell string   `json:"shell,omitempty"`
	Cwd   string   `json:"cwd"`
	// Started is when the process started, by the guest's clock.
	Started time.Time `json:"started"`
	// StdinOpen is true while ProcessStdinPath accepts bytes: the exec asked
	// for StdinOpen and its stdin was not closed yet.
	StdinOpen bool `json:"stdin_open"`
}

// SignalRequest names the signal for ProcessSignalPath: "SIGTERM", "TERM"
// or "term" all work. Empty means SIGKILL.
type SignalRequest struct {
	Signal string `json:"signal,omitempty"`
}

// Exec event types. Agents answer with stdout, stderr and exit events (the
// pid is in PidHeader); the daemon's streams begin with a start event.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
)

// ExecEvent is one line of the NDJSON response of PathExec. The stream always
// ends with exactly one EventExit; a stream that ends without it was cut.
type ExecEvent struct {
	Type string `json:"type"`
	// Pid is set in EventStart: the guest pid of the process (absent when
	// the sandbox's agent predates process control).
	Pid  int    `json:"pid,omitempty"`
	Data []byte `json:"data,omitempty"` // stdout/stderr bytes (base64 in JSON)
	// For EventExit. A process killed by a signal reports Signal ("SIGKILL")
	// and ExitCode 128+signal number, as shells do.
	ExitCode int    `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Error reports a failure after the stream started (waiting for the
	// process failed, output was lost). A process that cannot start at all
	// (executable or cwd missing) is answered with a Problem instead, before
	// any event.
	Error string `json:"error,omitempty"`
	// Code is Error's class, as a Problem's code ("failed_precondition"):
	// set by the daemon; absent from agents and older daemons, whose
	// Error ends with the class in words.
	Code           string `json:"code,omitempty"`
	DurationMicros int64  `json:"duration_us,omitempty"`
}

// FileInfo describes a guest file.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	IsDir   bool      `json:"is_dir"`
	IsLink  bool      `json:"is_link,omitempty"`
	ModTime time.Time `json:"mod_time"`
}

// MkdirRequest creates a directory.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
	Mode    uint32 `json:"mode,omitempty"` // default 0755
}

// PythonStartRequest starts the persistent Python session (at template
// creation) and runs warm-up code in it.
type PythonStartRequest struct {
	// Python executable, default "python3".
	Python string `json:"python,omitempty"`
	// Warm is run once in the session (e.g. "import pandas as pd").
	Warm          string `json:"warm,omitempty"`
	TimeoutMillis int64  `json:"timeout_ms,omitempty"`
}

// PythonStartResponse reports the warm-up.
type PythonStartResponse struct {
	Warm RunCodeResult `json:"warm"`
}

// RunCodeRequest runs code in the persistent Python session. Variables persist
// across calls.
type RunCodeRequest struct {
	Code          string `json:"code"`
	TimeoutMillis int64  `json:"timeout_ms,omitempty"`
}

// RehearseRequest runs code in a throwaway copy of the Python session
// (the runner forks; the copy's output is discarded), so that a pooled
// child has run a first request's code before its fork is asked for. The
// session itself is left as it was.
type RehearseRequest struct {
	Code          string `json:"code"`
	TimeoutMillis int64  `json:"timeout_ms,omitempty"`
}

// RunCodeResult is the outcome of one run_code call. Error is nil on success.
type RunCodeResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Result holds the value of the last expression by MIME type
	// ("text/plain": repr). Empty when the last statement is not an expression
	// or its value is None.
	Result map[string]string `json:"result,omitempty"`
	// Display holds rich outputs the code produced besides its value, in
	// order: each matplotlib figure left open (as "image/png", base64) and
	// each value passed to display(). Same MIME keys as Result.
	Display []map[string]string `json:"display,omitempty"`
	Error   *CodeError          `json:"error,omitempty"`
	// TimedOut is true when the code was interrupted by its timeout; the
	// session stays alive and its variables are kept.
	TimedOut       bool  `json:"timed_out,omitempty"`
	DurationMicros int64 `json:"duration_us"`
}

// CodeError is a Python exception.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Problem is the agent's error body (application/problem+json, RFC 9457
// subset). Code is an errdefs class code ("not_found", ...).
type Problem struct {
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// PathRunCodeStream runs code as PathRunCode does, streaming its output:
// POST RunCodeRequest; the response is an NDJSON stream of RunCodeEvent.
// Failures before the code starts (no session, the queue wait ended) are
// problem responses; the 200 is sent when the code starts.
const PathRunCodeStream = "/v1/run_code/stream"

// Event types of the PathRunCodeStream stream, besides EventStdout and
// EventStderr.
const (
	EventResult = "result"
	EventError  = "error"
)

// RunCodeEvent is one line of the NDJSON response of PathRunCodeStream:
// EventStdout and EventStderr events carry output as it appears (Data, a
// UTF-8 string; a chunk never splits a character, and bytes that are not
// UTF-8 become U+FFFD as in RunCodeResult), then the stream ends with
// exactly one EventResult (the code ran: success, exception or timeout;
// Result's Stdout and Stderr are empty since the output was streamed) or
// EventError (the code could not run to its end, e.g. the session died:
// Error, as a problem response would have said). A stream that ends
// without either was cut.
type RunCodeEvent struct {
	Type   string         `json:"type"`
	Data   string         `json:"data,omitempty"`
	Result *RunCodeResult `json:"result,omitempty"`
	Error  *Problem       `json:"error,omitempty"`
}

// ImageConfigPath is where an image built from an OCI image (recipe
// from = "REF") keeps that image's configuration in the guest's root file
// system. At boot the agent makes Env the base environment of the
// processes it starts, WorkingDir their default working directory and
// User the user execs run as; the rest is recorded for later use. Images
// of other recipes have no such file.
const ImageConfigPath = "/etc/forkd/image-config.json"

// ImageConfig is the JSON document at ImageConfigPath.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}
