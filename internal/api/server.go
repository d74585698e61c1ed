// Package api is forkd's HTTP API (v1): the daemon's only front door. The
// CLI and SDKs speak it over a Unix socket (0600); routes map one to one to
// engine calls, errors leave as RFC 9457 problem+json via StatusOf.
package api

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
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

// MaxBuildBody bounds an image build request, which carries its build
// context's files (base64: 4/3 of recipe.MaxContextBytes, and a margin).
const MaxBuildBody = 96 << 20

// Server serves the API for one engine.
type Server struct {
	Engine  Engine
	Version string
	Checks  func(ctx context.Context) []vmm.Check
	Log     *slog.Logger
	// Metrics, if set, records request metrics; /metrics serves it.
	Metrics *metrics.Metrics
	// Tokens, if set, is required (Authorization: Bearer) on every request
	// that did not come through the Unix socket, except GET /v1/healthz;
	// each token's role and tenant decide what it may do (authorize.go),
	// and the store holds the tenants' quotas. Without it every client is
	// an admin.
	Tokens *auth.Tokens

	// Audit, if set, receives one record per mutating request (those auth
	// refuses included) and per lifecycle event (RecordEvent). While it
	// cannot be written, mutating requests are refused with 503.
	Audit *audit.Log

	// PortDomain, if set, routes requests for the host PORT-ID.PortDomain
	// to that sandbox's port, whole paths included (ports.go).
	PortDomain string
	// TrustedKeys, if any, is the import policy: an archive must be
	// signed by one of them (403 otherwise; archive.go).
	TrustedKeys []ed25519.PublicKey
	// PrivateRegistries are registries (HOST or HOST:PORT, as in a
	// reference) that tenants may pull from although they are at
	// loopback or private addresses; every other registry a non-admin's
	// pull names must be public (oci.Auth.PublicOnly).
	PrivateRegistries []string
	// DefaultTimeout is the lifetime of a sandbox whose fork names none
	// (0: no limit); see lifetime.go.
	DefaultTimeout time.Duration

	feedOnce  sync.Once
	feedV     *feed // lifecycle events (feed.go); s.events() makes it
	proxyOnce sync.Once
	proxy     *httputil.ReverseProxy
	ops       operations
	idem      idempotency // Idempotency-Key records (idempotency.go)
	// execSessions bounds exec WebSockets (sessions.go).
	execSessions sessionSlots
	owners       snapshotOwners     // which tenant owns each snapshot tag (owners.go)
	refPulls     singleflight.Group // pulls for forks by reference, by local tag (forkref.go)
	auditGate    auditGate          // fails closed when audit writes fail (audit.go)
	unauthAudit  unauthLimiter      // bounds the records of unauthenticated requests (audit.go)

	// createSnapshotFn writes a snapshot for POST /v1/snapshots: nil is
	// the engine's CreateSnapshot; tests put a fake here.
	createSnapshotFn func(ctx context.Context, opts sandbox.CreateSnapshotOptions) (*snapshot.Snapshot, error)
}

// LoadState makes operations, idempotency keys and snapshot ownership
// durable in store and reads what an earlier daemon recorded. Call it
// before serving.
func (s *Server) LoadState(store *state.Store) error {
	if err := s.ops.load(store); err != nil {
		return err
	}
	if err := s.idem.load(store); err != nil {
		return err
	}
	return s.owners.load(store)
}

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
	mux.HandleFunc("GET /v1/info", s.info)
	mux.HandleFunc("GET /v1/doctor", s.doctor)
	mux.HandleFunc("GET /v1/images", s.listImages)
	mux.HandleFunc("POST /v1/images", s.buildImage)
	mux.HandleFunc("DELETE /v1/images/{digest}", s.deleteImage)
	mux.HandleFunc("GET /v1/system/df", s.diskUsage)
	mux.HandleFunc("POST /v1/system/prune", s.prune)
	mux.HandleFunc("GET /v1/events", s.streamEvents)
	mux.HandleFunc("GET /v1/operations", s.listOperations)
	mux.HandleFunc("GET /v1/operations/{id}", s.getOperation)
	mux.HandleFunc("GET /v1/operations/{id}/events", s.operationEvents)
	mux.HandleFunc("POST /v1/operations/{id}/cancel", s.cancelOperation)
	mux.HandleFunc("GET /v1/snapshots", s.listSnapshots)
	mux.HandleFunc("POST /v1/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /v1/snapshots/{tag}", s.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{tag}", s.deleteSnapshot)
	mux.HandleFunc("GET /v1/snapshots/{tag}/archive", s.exportArchive)
	mux.HandleFunc("POST /v1/snapshots/{tag}/compact", s.compactSnapshot)
	mux.HandleFunc("POST /v1/snapshots/import", s.importArchive)
	mux.HandleFunc("POST /v1/snapshots/pull", s.pullSnapshot)
	mux.HandleFunc("PUT /v1/snapshots/{tag}/shares/{tenant}", s.shareSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{tag}/shares/{tenant}", s.unshareSnapshot)
	mux.HandleFunc("GET /v1/tenants", s.listTenants)
	mux.HandleFunc("GET /v1/tenants/{tenant}", s.getTenant)
	mux.HandleFunc("PUT /v1/tenants/{tenant}/quota", s.putQuota)
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("POST /v1/sandboxes", s.fork)
	mux.HandleFunc("POST /v1/sandboxes/kill", s.kill)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	mux.HandleFunc("PATCH /v1/sandboxes/{id}", s.patchSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.exec)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", s.listProcesses)
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.processStdin)
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.signalProcess)
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/resize", s.resizeProcess)
	mux.HandleFunc("GET /v1/sandboxes/{id}/exec/ws", s.execWS) // execWSPattern
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
	// auth, an admin's acting for a tenant, the audit gate (which needs
	// the principal), authorization (authorize.go: roles and tenants),
	// the routes.
	var h http.Handler = s.actFor(s.auditAdmit(s.authorize(mux)))
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
	out := apiv1.Version{
		Version: s.Version, GoVersion: runtime.Version(), VMM: d.Name(), VMMVersion: v,
		Accel: string(s.Engine.Config().Accel), DataDir: s.Engine.Config().DataDir,
	}
	if !s.principalOf(r).Admin() {
		out.DataDir = "" // the host's layout is the operator's business
	}
	writeJSON(w, out)
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
	out := apiv1.Image{
		Digest: img.Digest, Recipe: img.Recipe, KernelVersion: img.KernelVersion,
		MemoryMiB: img.MemoryMiB, VCPUs: img.VCPUs, SizeBytes: size, Created: img.Created, Dir: img.Dir,
	}
	if img.From != nil {
		out.From, out.FromDigest = img.From.Ref, img.From.Digest
	}
	return out
}

// listImages lists the built images, a page at a time (paging.go),
// newest first.
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
	writePage(w, r, out, imageOrder)
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
	if err := checkExec(req); err != nil {
		writeProblem(w, r, err)
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
