package apiv1

// The exec WebSocket (GET /v1/sandboxes/{id}/exec/ws) runs one process
// with its input always open, for interactive clients (a terminal).
//
//	client -> server  text: the JSON ExecRequest (first message; stdin and
//	                  stdin_open are ignored)
//	server -> client  text: ExecWSStart
//	server -> client  binary: ExecWSStdout or ExecWSStderr, then the bytes
//	client -> server  binary: ExecWSStdin, then the bytes
//	client -> server  text: ExecWSControl (resize, signal, close_stdin)
//	server -> client  text: ExecWSExit, then close 1000
//
// A failure before the process starts is an ExecWSError, then a close
// with code 4000 + the HTTP status the problem would have had (4400,
// 4404, 4409). A bad control message is an ExecWSError too; the process
// runs on. A client that goes away kills the process group.

// ExecWSProtocol is the WebSocket subprotocol clients must ask for.
const ExecWSProtocol = "forkd.exec.v1"

// ExecWSReadLimit bounds each message a client sends.
const ExecWSReadLimit = 64 << 10

// Stream bytes: the first byte of every binary message.
const (
	ExecWSStdin  byte = 0
	ExecWSStdout byte = 1
	ExecWSStderr byte = 2
)

// Text message types.
const (
	ExecWSTypeStart      = "start"
	ExecWSTypeExit       = "exit"
	ExecWSTypeError      = "error"
	ExecWSTypeResize     = "resize"
	ExecWSTypeSignal     = "signal"
	ExecWSTypeCloseStdin = "close_stdin"
)

// ExecWSCloseBase plus an HTTP status is the close code of a session
// whose process did not start.
const ExecWSCloseBase = 4000

// ExecWSStart says the process runs: Pid is its guest pid, for
// /v1/sandboxes/{id}/processes/{pid}/….
type ExecWSStart struct {
	Type string `json:"type"`
	Pid  int    `json:"pid"`
}

// ExecWSExit ends the session, as ExecEvent's exit event does.
type ExecWSExit struct {
	Type           string `json:"type"`
	ExitCode       int    `json:"exit_code"`
	Signal         string `json:"signal,omitempty"`
	TimedOut       bool   `json:"timed_out"`
	Error          string `json:"error,omitempty"`
	Code           string `json:"code,omitempty"`
	DurationMicros int64  `json:"duration_us,omitempty"`
}

// ExecWSError reports a request or a control message the server refused.
type ExecWSError struct {
	Type  string  `json:"type"`
	Error Problem `json:"error"`
}

// ExecWSControl is a client's text message after the start: "resize"
// (Rows, Cols), "signal" (Signal, as SignalRequest; "" is SIGKILL) or
// "close_stdin".
type ExecWSControl struct {
	Type   string `json:"type"`
	Rows   int    `json:"rows,omitempty"`
	Cols   int    `json:"cols,omitempty"`
	Signal string `json:"signal,omitempty"`
}
