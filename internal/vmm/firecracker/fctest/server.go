package fctest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
)

// Call is one request the fake received, with what it answered.
type Call struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body,omitempty"`
	Status int             `json:"status"`
	// Fault is the fault_message of an error answer.
	Fault string `json:"fault,omitempty"`
}

// String is "PUT /snapshot/load 204".
func (c Call) String() string { return fmt.Sprintf("%s %s %d", c.Method, c.Path, c.Status) }

// vmState is the API's view of the microVM.
type vmState int

const (
	notStarted vmState = iota
	running
	paused
)

func (s vmState) String() string { return [...]string{"Not started", "Running", "Paused"}[s] }

// Messages of the state machine's refusals, as Firecracker words them.
const (
	msgAfterStart  = "The requested operation is not supported after starting the microVM."
	msgBeforeStart = "The requested operation is not supported before starting the microVM."
	msgLoadLate    = "Loading a microVM snapshot not allowed after configuring boot-specific resources."
	msgNotPaused   = "Cannot create snapshot: the microVM is not paused."
)

// Server is a fake Firecracker API server. Serve it on a Unix socket;
// see the package doc for what it checks.
type Server struct {
	spec *Spec
	id   string
	// Console stands in for the guest's serial console (Firecracker's
	// stdout): the fake writes a line to it when the guest "boots".
	console io.Writer
	// callLog, if set, receives every Call as a JSON line.
	callLog io.Writer

	// mu guards the fields below.
	mu         sync.Mutex
	diffs      int // Diff snapshots taken (DiffPages)
	calls      []Call
	violations []string
	faults     map[string][]fault
	state      vmState
	configured bool // a boot resource was set (anything but logger and metrics)
	loaded     bool // a snapshot was loaded
	cfg        vmConfig
	vsock      net.Listener
	stopped    chan struct{} // closed by SendCtrlAltDel: the VMM exits
}

type fault struct {
	status int
	msg    string
}

// vmConfig is the device configuration the fake keeps, and writes into
// a snapshot's state file.
type vmConfig struct {
	Boot       map[string]any            `json:"boot_source,omitempty"`
	Machine    map[string]any            `json:"machine_config,omitempty"`
	Drives     map[string]map[string]any `json:"drives,omitempty"`
	Ifaces     map[string]map[string]any `json:"network_interfaces,omitempty"`
	Vsock      map[string]any            `json:"vsock,omitempty"`
	Entropy    bool                      `json:"entropy,omitempty"`
	TrackDirty bool                      `json:"track_dirty_pages,omitempty"`
}

// NewServer returns a fake for the instance id. console may be nil.
func NewServer(spec *Spec, id string, console io.Writer) *Server {
	if console == nil {
		console = io.Discard
	}
	return &Server{spec: spec, id: id, console: console, faults: map[string][]fault{}, stopped: make(chan struct{}),
		cfg: vmConfig{Drives: map[string]map[string]any{}, Ifaces: map[string]map[string]any{}}}
}

// Fail makes the next request for method and path (e.g. "PUT",
// "/snapshot/load") that passes validation fail with status and a
// fault_message. Faults queue up per request.
func (s *Server) Fail(method, path string, status int, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := method + " " + path
	s.faults[k] = append(s.faults[k], fault{status, msg})
}

// Calls returns the requests received so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Violations returns what broke the contract: requests the description
// does not allow, and (a bug in the fake) answers it does not document.
// Refusals by the state machine are answers, not violations.
func (s *Server) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

// Stopped is closed when the guest asked to stop (SendCtrlAltDel): a
// real Firecracker exits then.
func (s *Server) Stopped() <-chan struct{} { return s.stopped }

// Serve answers requests on l until it is closed.
func (s *Server) Serve(l net.Listener) error {
	err := (&http.Server{Handler: s}).Serve(l)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Close releases the vsock listener.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vsock != nil {
		s.vsock.Close()
		s.vsock = nil
	}
}

// bodyLimit bounds a request body; Firecracker's own limit is 50 KiB.
const bodyLimit = 50 << 10

// ServeHTTP validates and answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, bodyLimit+1))
	if err == nil && len(body) > bodyLimit {
		err = fmt.Errorf("request body over %d bytes", bodyLimit)
	}
	call := Call{Method: r.Method, Path: r.URL.Path}
	if json.Valid(body) {
		call.Body = json.RawMessage(bytes.Clone(body))
	}
	var (
		status = http.StatusBadRequest
		reply  any
		op     *Operation
		params map[string]string
	)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if ct := r.Header.Get("Content-Type"); len(body) > 0 && ct != "application/json" {
			err = fmt.Errorf("%s %s: Content-Type %q, the API consumes application/json", r.Method, r.URL.Path, ct)
		}
	}
	var v any
	if err == nil {
		op, params, err = s.spec.Lookup(r.Method, r.URL.Path)
	}
	if err == nil {
		v, err = op.CheckRequest(body)
	}
	if err != nil {
		s.violations = append(s.violations, err.Error())
		reply = errorBody("fctest contract violation: " + err.Error())
	} else if f := s.takeFault(r.Method + " " + r.URL.Path); f != nil {
		status, reply = f.status, errorBody(f.msg)
	} else {
		obj, _ := v.(map[string]any)
		status, reply = s.handle(op, params, obj)
	}
	var out []byte
	if reply != nil {
		out, _ = json.Marshal(reply)
	}
	if op != nil {
		if err := op.CheckResponse(status, out); err != nil {
			s.violations = append(s.violations, "fctest answered outside the description: "+err.Error())
		}
	}
	if e, ok := reply.(map[string]string); ok {
		call.Fault = e["fault_message"]
	}
	call.Status = status
	s.record(call)
	if out != nil {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(status)
	w.Write(out)
}

func (s *Server) record(c Call) {
	s.calls = append(s.calls, c)
	if s.callLog != nil {
		b, _ := json.Marshal(c)
		s.callLog.Write(append(b, '\n'))
	}
}

func (s *Server) takeFault(k string) *fault {
	q := s.faults[k]
	if len(q) == 0 {
		return nil
	}
	s.faults[k] = q[1:]
	return &q[0]
}

func errorBody(msg string) map[string]string { return map[string]string{"fault_message": msg} }

// noContent is the answer of a request that succeeded without a body.
func noContent() (int, any) { return http.StatusNoContent, nil }

func badRequest(format string, a ...any) (int, any) {
	return http.StatusBadRequest, errorBody(fmt.Sprintf(format, a...))
}

// handle runs one valid request through the state machine. Called with
// s.mu held.
func (s *Server) handle(op *Operation, params map[string]string, body map[string]any) (int, any) {
	switch op.ID {
	case "getFirecrackerVersion":
		return http.StatusOK, map[string]string{"firecracker_version": s.spec.Version}
	case "describeInstance":
		return http.StatusOK, map[string]string{"app_name": "Firecracker", "id": s.id, "state": s.state.String(), "vmm_version": s.spec.Version}
	case "putLogger", "putMetrics":
		return s.preBoot(false, func() (int, any) { return noContent() })
	case "putGuestBootSource":
		return s.preBoot(true, func() (int, any) {
			if err := mustExist(body, "kernel_image_path", "initrd_path"); err != nil {
				return badRequest("%v", err)
			}
			s.cfg.Boot = body
			return noContent()
		})
	case "putMachineConfiguration":
		return s.preBoot(true, func() (int, any) {
			s.cfg.Machine = body
			s.cfg.TrackDirty, _ = body["track_dirty_pages"].(bool)
			return noContent()
		})
	case "putGuestDriveByID":
		return s.preBoot(true, func() (int, any) { return s.putDrive(params["drive_id"], body) })
	case "putGuestNetworkInterfaceByID":
		return s.preBoot(true, func() (int, any) {
			if id := params["iface_id"]; body["iface_id"] != id {
				return badRequest("The iface_id in the path (%s) does not match the body (%v).", id, body["iface_id"])
			}
			s.cfg.Ifaces[params["iface_id"]] = body
			return noContent()
		})
	case "putGuestVsock":
		return s.preBoot(true, func() (int, any) { s.cfg.Vsock = body; return noContent() })
	case "putEntropyDevice":
		return s.preBoot(true, func() (int, any) { s.cfg.Entropy = true; return noContent() })
	case "createSyncAction":
		return s.action(body["action_type"].(string))
	case "patchVm":
		if s.state == notStarted {
			return badRequest(msgBeforeStart)
		}
		if body["state"] == "Paused" {
			s.state = paused
		} else {
			s.state = running
		}
		return noContent()
	case "patchGuestDriveByID":
		return s.patchDrive(params["drive_id"], body)
	case "createSnapshot":
		return s.createSnapshot(body)
	case "loadSnapshot":
		return s.loadSnapshot(body)
	}
	if op.Method == http.MethodGet {
		return badRequest("fctest: %s is not modelled", op.ID)
	}
	return s.preBoot(true, func() (int, any) { return noContent() })
}

// preBoot runs f for a request Firecracker takes only before the guest
// starts; boot says whether it configures the guest (which rules out a
// later snapshot load).
func (s *Server) preBoot(boot bool, f func() (int, any)) (int, any) {
	if s.state != notStarted || s.loaded {
		return badRequest(msgAfterStart)
	}
	status, reply := f()
	if boot && status < 300 {
		s.configured = true
	}
	return status, reply
}

func (s *Server) putDrive(id string, body map[string]any) (int, any) {
	if body["drive_id"] != id {
		return badRequest("The drive_id in the path (%s) does not match the body (%v).", id, body["drive_id"])
	}
	if err := mustExist(body, "path_on_host"); err != nil {
		return badRequest("Unable to create the block device: %v", err)
	}
	if body["is_root_device"] == true {
		for other, d := range s.cfg.Drives {
			if other != id && d["is_root_device"] == true {
				return badRequest("A root block device already exists!")
			}
		}
	}
	s.cfg.Drives[id] = body
	return noContent()
}

func (s *Server) patchDrive(id string, body map[string]any) (int, any) {
	if s.state == notStarted && !s.loaded {
		return badRequest(msgBeforeStart)
	}
	d, ok := s.cfg.Drives[id]
	if !ok || body["drive_id"] != id {
		return badRequest("Invalid block device ID: %s", id)
	}
	if err := mustExist(body, "path_on_host"); err != nil {
		return badRequest("Unable to patch the block device: %v", err)
	}
	for k, v := range body {
		d[k] = v
	}
	return noContent()
}

func (s *Server) action(kind string) (int, any) {
	switch kind {
	case "InstanceStart":
		if s.state != notStarted || s.loaded {
			return badRequest(msgAfterStart)
		}
		if s.cfg.Boot == nil {
			return badRequest("Cannot start microvm without kernel configuration.")
		}
		if err := s.listenVsock(); err != nil {
			return badRequest("Cannot create the vsock device: %v", err)
		}
		s.state = running
		fmt.Fprintf(s.console, "fctest: guest %s booted (no guest runs: contract test)\n", s.id)
	case "SendCtrlAltDel":
		if s.state == notStarted {
			return badRequest(msgBeforeStart)
		}
		select {
		case <-s.stopped:
		default:
			close(s.stopped)
		}
	}
	return noContent()
}

// mustExist fails when a path field that is set names no file.
func mustExist(body map[string]any, keys ...string) error {
	for _, k := range keys {
		p, ok := body[k].(string)
		if !ok {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
	}
	return nil
}
