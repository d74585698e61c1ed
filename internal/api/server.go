// Package api is forkd's HTTP API (v1): the daemon's only front door. The
// CLI and SDKs speak it over a Unix socket (0600); routes map one to one to
// engine calls, errors leave as RFC 9457 problem+json via StatusOf.
package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// MaxJSONBody bounds JSON request bodies; file uploads stream and are not
// bounded by it.
const MaxJSONBody = 1 << 20

// Server serves the API for one engine.
type Server struct {
	Engine  *sandbox.Engine
	Version string
	Checks  func(ctx context.Context) []vmm.Check
	Log     *slog.Logger
	// Metrics, if set, records request metrics; /metrics serves it.
	Metrics *metrics.Metrics
	// Tokens, if set, is required (Authorization: Bearer) on every request
	// that did not come through the Unix socket, except GET /v1/healthz.
	Tokens *auth.Tokens

	// Audit, if set, receives one record per mutating request (those auth
	// refuses included) and per lifecycle event (RecordEvent). While it
	// cannot be written, mutating requests are refused with 503.
	Audit *audit.Log

	// PortDomain, if set, routes requests for the host PORT-ID.PortDomain
	// to that sandbox's port, whole paths included (ports.go).
	PortDomain string

	proxyOnce   sync.Once
	proxy       *httputil.ReverseProxy
	ops         operations
	auditGate   auditGate     // fails closed when audit writes fail (audit.go)
	unauthAudit unauthLimiter // bounds the records of unauthenticated requests (audit.go)
}

// LoadOperations makes operations durable in store and reads those an
// earlier daemon recorded. Call it before serving.
func (s *Server) LoadOperations(store *state.Store) error { return s.ops.load(store) }

type ctxKey struct{}

func requestID(r *http.Request) string {
	id, _ := r.Context().Value(ctxKey{}).(string)
	return id
}

// Handler returns the routed handler with request ids and logging.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, map[string]string{"status": "ok"}) })
	mux.HandleFunc("GET /v1/version", s.version)
	mux.HandleFunc("GET /v1/doctor", s.doctor)
	mux.HandleFunc("GET /v1/images", s.listImages)
	mux.HandleFunc("POST /v1/images", s.buildImage)
	mux.HandleFunc("GET /v1/operations", s.listOperations)
	mux.HandleFunc("GET /v1/operations/{id}", s.getOperation)
	mux.HandleFunc("GET /v1/snapshots", s.listSnapshots)
	mux.HandleFunc("POST /v1/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /v1/snapshots/{tag}", s.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{tag}", s.deleteSnapshot)
	mux.HandleFunc("GET /v1/snapshots/{tag}/archive", s.exportArchive)
	mux.HandleFunc("POST /v1/snapshots/{tag}/compact", s.compactSnapshot)
	mux.HandleFunc("POST /v1/snapshots/import", s.importArchive)
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("POST /v1/sandboxes", s.fork)
	mux.HandleFunc("POST /v1/sandboxes/kill", s.kill)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.exec)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", s.listProcesses)
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.processStdin)
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.signalProcess)
	mux.HandleFunc("POST /v1/sandboxes/{id}/run_code", s.runCode)
	mux.HandleFunc("POST /v1/sandboxes/{id}/branch", s.branch)
	mux.HandleFunc("GET /v1/sandboxes/{id}/network", s.getNetwork)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", s.putNetwork)
	mux.HandleFunc("GET /v1/sandboxes/{id}/ports/{port}", s.portInfo)
	// An app's HTTP and WebSocket traffic (ports.go).
	mux.HandleFunc("GET /v1/sandboxes/{id}/ports/{port}/{path...}", s.proxyPort)
	mux.HandleFunc("POST /v1/sandboxes/{id}/ports/{port}/{path...}", s.proxyPort)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/ports/{port}/{path...}", s.proxyPort)
	mux.HandleFunc("PATCH /v1/sandboxes/{id}/ports/{port}/{path...}", s.proxyPort)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/ports/{port}/{path...}", s.proxyPort)
	mux.HandleFunc("POST /v1/sandboxes/{id}/run_code/stream", s.runCodeStream)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", s.readFile)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", s.writeFile)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", s.removeFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", s.listFiles)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", s.statFile)
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir)
	mux.Handle("GET /v1/openapi.json", OpenAPIHandler())
	mux.Handle("GET /metrics", s.Metrics.Handler())
	s.mountMCP(mux) // POST/GET/DELETE /mcp: MCP streamable HTTP (mcp.go)
	// No pattern took the request: 405 with Allow when the path has routes
	// for other methods, else 404 (problem.go).
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { noRoute(mux, w, r) })
	// Inside the request id, so 401s carry one too: metrics, then the
	// audit record (outside auth, so refused requests are recorded too),
	// auth, the audit gate (which needs the token name), the routes.
	var h http.Handler = s.auditAdmit(mux)
	if s.Tokens != nil {
		h = auth.Middleware(s.Tokens, h)
	}
	h = s.auditRequests(mux, h)
	h = Instrument(s.Metrics, mux, h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !validRequestID(id) {
			var b [8]byte
			rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set("X-Request-Id", id)
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, id))
		s.hostRoute(r)
		start := time.Now()
		h.ServeHTTP(w, r)
		if s.Log != nil {
			s.Log.Debug("request", "method", r.Method, "path", r.URL.Path, "request_id", id, "duration", time.Since(start))
		}
	})
}

// agentOf returns the agent of the sandbox the path's {id} names, or
// answers the problem (no such sandbox, not running) and returns nil. The
// sandbox counts as busy (its idle timeout waits) until the request's
// context ends, which happens when the handler returns.
func (s *Server) agentOf(w http.ResponseWriter, r *http.Request) *agentclient.Client {
	agent, err := s.Engine.AgentFor(r.Context(), r.PathValue("id"))
	if err != nil {
		writeProblem(w, r, err)
		return nil
	}
	return agent
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) {
	d := s.Engine.Driver()
	v, _ := d.Version(r.Context())
	writeJSON(w, apiv1.Version{
		Version: s.Version, GoVersion: runtime.Version(), VMM: d.Name(), VMMVersion: v,
		Accel: string(s.Engine.Config().Accel), DataDir: s.Engine.Config().DataDir,
	})
}

func (s *Server) doctor(w http.ResponseWriter, r *http.Request) {
	var out []apiv1.Check
	if s.Checks != nil {
		for _, c := range s.Checks(r.Context()) {
			out = append(out, apiv1.Check{Name: c.Name, OK: c.OK, Detail: c.Detail, Fix: c.Fix})
		}
	}
	writeJSON(w, out)
}

func imageInfo(img *image.Image) apiv1.Image {
	var size int64
	for _, f := range img.Files {
		size += f.Size
	}
	return apiv1.Image{
		Digest: img.Digest, Recipe: img.Recipe, KernelVersion: img.KernelVersion,
		MemoryMiB: img.MemoryMiB, VCPUs: img.VCPUs, SizeBytes: size, Created: img.Created, Dir: img.Dir,
	}
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := s.Engine.Images()
	if err != nil && len(imgs) == 0 {
		writeProblem(w, r, err)
		return
	}
	out := []apiv1.Image{}
	for _, img := range imgs {
		out = append(out, imageInfo(img))
	}
	writeJSON(w, out)
}

// progressStream writes NDJSON progress lines for a long-running request
// and flushes each one, so the CLI can show what the daemon is doing.
type progressStream struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	enc *json.Encoder
}

func newProgressStream(w http.ResponseWriter) *progressStream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &progressStream{w: w, enc: json.NewEncoder(w)}
}

func (p *progressStream) send(v apiv1.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.enc.Encode(v)
	http.NewResponseController(p.w).Flush()
}

func (p *progressStream) message(msg string) { p.send(apiv1.Progress{Message: msg}) }

func (s *Server) snapshotInfo(snap *snapshot.Snapshot) apiv1.Snapshot {
	out := apiv1.Snapshot{
		Tag: snap.Tag, ID: snap.ID, Created: snap.Created, Recipe: snap.Image.Recipe, ImageDigest: snap.Image.Digest,
		VMM: snap.VMM.Kind, VMMVersion: snap.VMM.Version, Accel: snap.VMM.Accel,
		MemoryMiB: snap.MemoryMiB, VCPUs: snap.VCPUs, Python: snap.Python.Enabled,
		Files: map[string]apiv1.FileEntry{}, CreateMillis: snap.CreateMillis,
		Pooled: s.Engine.PoolSize(snap.ID), State: apiv1.SnapshotReady,
	}
	s.chainInfo(snap, &out)
	for name, f := range snap.Files {
		out.Files[name] = apiv1.FileEntry{Size: f.Size, SHA256: f.SHA256}
		out.SizeBytes += f.Size
		var st syscall.Stat_t
		if syscall.Stat(snap.Path(name), &st) == nil {
			out.DiskBytes += st.Blocks * 512
		}
	}
	return out
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	snaps, err := s.Engine.Store().List()
	if err != nil && len(snaps) == 0 {
		writeProblem(w, r, err)
		return
	}
	out := []apiv1.Snapshot{}
	for _, snap := range snaps {
		out = append(out, s.snapshotInfo(snap))
	}
	for _, p := range s.Engine.PendingList() {
		out = append(out, pendingInfo(p))
	}
	writeJSON(w, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.Engine.Store().Get(r.PathValue("tag"))
	if err != nil {
		if p, ok := s.Engine.Pending(r.PathValue("tag")); ok {
			writeJSON(w, pendingInfo(p))
			return
		}
		// A background branch commits before it stops being pending:
		// look again, in case it did so between the two lookups.
		if snap, err = s.Engine.Store().Get(r.PathValue("tag")); err != nil {
			writeProblem(w, r, err)
			return
		}
	}
	writeJSON(w, s.snapshotInfo(snap))
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req apiv1.CreateSnapshotRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	opts := sandbox.CreateSnapshotOptions{
		Tag: req.Tag, Recipe: req.Recipe, RecipeTOML: req.RecipeTOML, Warm: req.Warm, MemoryMiB: req.MemoryMiB, VCPUs: req.VCPUs,
		Network: policyOf(req.Network),
	}
	// Validate everything that can be checked before committing to a
	// stream (tag, recipe, memory, vCPUs, warm-up code, disk space), and
	// take the build slot, so bad input is a plain 4xx and a full daemon
	// a 429 with Retry-After, not a 200 that fails later.
	if err := s.Engine.CheckCreateSnapshot(opts); err != nil {
		writeProblem(w, r, err)
		return
	}
	slot, err := s.Engine.TryAcquireBuild("create snapshot " + req.Tag)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	ps := newProgressStream(w)
	opts.Progress, opts.Slot = ps.message, slot
	snap, err := s.Engine.CreateSnapshot(r.Context(), opts)
	if err != nil {
		noteError(r, err)
		p := ProblemOf(err, requestID(r))
		ps.send(apiv1.Progress{Error: &p})
		return
	}
	noteTargets(r, snap.Tag)
	info := s.snapshotInfo(snap)
	ps.send(apiv1.Progress{Snapshot: &info})
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	out := []apiv1.Sandbox{}
	tag := r.URL.Query().Get("tag")
	state := r.URL.Query().Get("state")
	if state != "" && !slices.Contains(apiv1.SandboxStates, state) {
		writeProblem(w, r, fmt.Errorf("state filter %q: want one of %s: %w",
			state, strings.Join(apiv1.SandboxStates, ", "), errdefs.ErrInvalidArgument))
		return
	}
	labels := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeProblem(w, r, fmt.Errorf("label filter %q: want key=value: %w", l, errdefs.ErrInvalidArgument))
			return
		}
		labels[k] = v
	}
	for _, sb := range s.Engine.List() {
		if !sb.MatchLabels(labels) {
			continue
		}
		info := sb.Info()
		if (tag != "" && info.Tag != tag) || (state != "" && info.State != state) {
			continue
		}
		out = append(out, info)
	}
	writeJSON(w, out)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req apiv1.ForkRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if err := snapshot.ValidateTag(req.Tag); err != nil {
		writeProblem(w, r, err)
		return
	}
	start := time.Now()
	sbs, err := s.Engine.ForkWith(r.Context(), sandbox.ForkOptions{
		Tag: req.Tag, Count: req.Count, Labels: req.Metadata, RequestID: requestID(r), Network: policyOf(req.Network),
		Timeout:     time.Duration(req.TimeoutSeconds) * time.Second,
		IdleTimeout: time.Duration(req.IdleTimeoutSeconds) * time.Second,
	})
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	resp := apiv1.ForkResponse{TotalMillis: float64(time.Since(start).Microseconds()) / 1000}
	for _, sb := range sbs {
		resp.Sandboxes = append(resp.Sandboxes, sb.Info())
		noteTargets(r, sb.ID)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(resp)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.Engine.Get(r.PathValue("id"))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	info := sb.Info()
	info.Network = sb.NetworkInfo(true)
	writeJSON(w, info)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	if _, err := s.Engine.Kill(r.Context(), []string{r.PathValue("id")}); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	var req apiv1.KillRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if req.All == (len(req.IDs) > 0) {
		writeProblem(w, r, fmt.Errorf("give either sandbox ids or all=true: %w", errdefs.ErrInvalidArgument))
		return
	}
	var killed []string
	var err error
	if req.All {
		killed = s.Engine.KillAll(r.Context())
	} else {
		killed, err = s.Engine.Kill(r.Context(), req.IDs)
	}
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	if killed == nil {
		killed = []string{}
	}
	noteTargets(r, killed...)
	writeJSON(w, apiv1.KillResponse{Killed: killed})
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	var req apiv1.RunCodeRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	res, err := agent.RunCode(r.Context(), agentRunCode(req))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, res)
}

func queryPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", fmt.Errorf("missing ?path= (an absolute path inside the sandbox): %w", errdefs.ErrInvalidArgument)
	}
	return p, ValidateGuestPath(p)
}

func parseMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %q: want octal permission bits like 0644: %w", s, errdefs.ErrInvalidArgument)
	}
	return uint32(m), nil
}

// lazyWriter sends the success header on the first byte, so an error that
// happens before any data can still become a problem response.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/octet-stream")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(p)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	lw := &lazyWriter{w: w}
	if _, err := agent.ReadFile(r.Context(), path, lw); err != nil {
		if !lw.started {
			writeProblem(w, r, err)
			return
		}
		// Mid-stream failure: cut the connection so the client cannot take
		// partial content for the whole file.
		panic(http.ErrAbortHandler)
	}
	if !lw.started {
		lw.Write(nil)
	}
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	mode, err := parseMode(r.URL.Query().Get("mode"), 0o644)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	fi, err := agent.WriteFile(r.Context(), path, fs.FileMode(mode), r.Body)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, fi)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	recursive, err := httpquery.Bool(r.URL.Query(), "recursive", false)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	if err := agent.Remove(r.Context(), path, recursive); err != nil {
		writeProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	list, err := agent.ListFiles(r.Context(), path)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, list)
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	path, err := queryPath(r)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	fi, err := agent.Stat(r.Context(), path)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, fi)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req apiv1.MkdirRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	if err := ValidateGuestPath(req.Path); err != nil {
		writeProblem(w, r, err)
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	fi, err := agent.Mkdir(r.Context(), req)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, fi)
}

// maxBufferedOutput bounds each of stdout and stderr in a buffered
// (application/json) exec answer; streams are unbounded.
const maxBufferedOutput = 16 << 20

// exec proxies a process's stdin, output and exit to the client: streamed
// as NDJSON events (default) or Server-Sent Events (Accept:
// text/event-stream), or buffered into one JSON result (Accept:
// application/json).
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req apiv1.ExecRequest
	hdr := r.Header.Get(apiv1.ExecHeader)
	if hdr == "" {
		writeProblem(w, r, fmt.Errorf("missing %s header with the JSON exec request: %w", apiv1.ExecHeader, errdefs.ErrInvalidArgument))
		return
	}
	if err := decodeStrictJSON([]byte(hdr), &req); err != nil {
		writeProblem(w, r, fmt.Errorf("%s header: %w", apiv1.ExecHeader, err))
		return
	}
	if (len(req.Argv) == 0) == (req.Shell == "") {
		writeProblem(w, r, fmt.Errorf("exec needs exactly one of argv or shell: %w", errdefs.ErrInvalidArgument))
		return
	}
	agent := s.agentOf(w, r)
	if agent == nil {
		return
	}
	proxyExec(w, r, agent, req)
}

// execStarter is the agent client's exec (an interface so the proxy is
// tested without an engine).
type execStarter interface {
	ExecStarted(ctx context.Context, req agentapi.ExecRequest, stdin io.Reader, started func(pid int), stdout, stderr io.Writer) (agentapi.ExecEvent, error)
}

// proxyExec runs req through agent and answers as exec describes.
func proxyExec(w http.ResponseWriter, r *http.Request, agent execStarter, req apiv1.ExecRequest) {
	var stdin io.Reader
	if req.Stdin {
		stdin = r.Body
	}
	rc := http.NewResponseController(w)
	rc.EnableFullDuplex()
	accept := r.Header.Get("Accept")
	if strings.Contains(accept, "application/json") && !strings.Contains(accept, ndjson) {
		var out, errb boundedBuffer
		out.max, errb.max = maxBufferedOutput, maxBufferedOutput
		pid := 0
		exit, err := agent.ExecStarted(r.Context(), req, stdin, func(p int) { pid = p }, &out, &errb)
		if err != nil {
			writeProblem(w, r, err)
			return
		}
		if pid > 0 {
			w.Header().Set(apiv1.PidHeader, strconv.Itoa(pid))
		}
		writeJSON(w, apiv1.ExecResult{
			Pid: pid, Stdout: out.String(), Stderr: errb.String(), StdoutTruncated: out.truncated, StderrTruncated: errb.truncated,
			ExitCode: exit.ExitCode, Signal: exit.Signal, TimedOut: exit.TimedOut, DurationMicros: exit.DurationMicros,
		})
		return
	}
	// The 200 goes out once the agent has started the process, so a
	// process that cannot start (no such executable) is a problem
	// response, not a stream with a failed exit. The start event comes
	// first, with the pid that /v1/sandboxes/{id}/processes/{pid}/… take.
	var ev *eventWriter
	started := func(pid int) {
		if pid > 0 {
			w.Header().Set(apiv1.PidHeader, strconv.Itoa(pid))
		}
		ev = startEvents(w, r, rc)
		ev.send(agentapi.EventStart, apiv1.ExecEvent{Type: agentapi.EventStart, Pid: pid})
	}
	out := func(typ string) io.Writer {
		return writerFunc(func(p []byte) (int, error) {
			return ev.stream(typ, func(p []byte) any { return apiv1.ExecEvent{Type: typ, Data: append([]byte(nil), p...)} }).Write(p)
		})
	}
	exit, err := agent.ExecStarted(r.Context(), req, stdin, started, out(agentapi.EventStdout), out(agentapi.EventStderr))
	if err != nil && ev == nil {
		writeProblem(w, r, err)
		return
	}
	if err != nil {
		// The stream already said 200: the audit record must not.
		noteError(r, err)
		exit = apiv1.ExecEvent{ExitCode: -1, Error: err.Error(), Code: errdefs.Code(err)}
	}
	exit.Type = agentapi.EventExit
	ev.send(exit.Type, exit)
}

// writerFunc is an io.Writer made of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// boundedBuffer keeps the first max bytes written and notes truncation.
type boundedBuffer struct {
	bytes.Buffer
	max       int
	truncated bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.truncated = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}
