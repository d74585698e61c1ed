package handler

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/guest/identity"
	"github.com/forkd-dev/forkd/internal/guest/procenv"
	"github.com/forkd-dev/forkd/internal/guest/pysession"
)

// Config configures the agent's API.
type Config struct {
	// Version is reported in Info.AgentVersion.
	Version string
	// ApplySystemIdentity sets the clock, reseeds the kernel RNG and sets
	// the hostname when an identity is applied. It needs root in the VM;
	// tests running unprivileged turn it off (Python is reseeded either way).
	ApplySystemIdentity bool
	// Env is the base environment of processes; default procenv.Default.
	Env []string
	// Cwd is where processes start when their request names no directory
	// (an OCI image's WorkingDir); empty or missing: HOME, else /.
	Cwd string
	// User is whom processes run as when their request names nobody (an
	// image's USER); empty: root.
	User string
	// ChangesDir is the overlay's upper directory, which PathChanges
	// streams as a layer; empty: the root is not an overlay (412).
	ChangesDir string
	// RunDir holds the agent's runtime files (the Python runner); default
	// /run/forkd.
	RunDir string
	// Python configures the persistent Python session (its Env and Dir
	// default to the fields above).
	Python pysession.Config
	// ExecDrain bounds how long output is still collected after a process
	// has exited, from children it left running that hold its stdout; it
	// ends once the pipes stay quiet for ExecQuiet. Defaults 2s and 100ms.
	ExecDrain, ExecQuiet time.Duration
	// Shutdown powers the VM off; the agent calls it after answering
	// PathShutdown. nil: shutdown is not implemented (dev mode, tests).
	Shutdown func()
	// Logf logs; nil uses the log package.
	Logf func(format string, args ...any)
}

// Agent serves the API. It implements http.Handler.
type Agent struct {
	cfg   Config
	mux   *http.ServeMux
	py    *pysession.Manager
	start time.Time
	procs processTable // running execs, by pid

	mu          sync.Mutex
	sandboxID   string
	applyMicros int64
}

// New returns the agent's API.
func New(cfg Config) *Agent {
	if cfg.Env == nil {
		cfg.Env = procenv.Default
	}
	if cfg.RunDir == "" {
		cfg.RunDir = "/run/forkd"
	}
	if cfg.Python.Env == nil {
		cfg.Python.Env = cfg.Env
	}
	if cfg.Python.Dir == "" {
		cfg.Python.Dir = cfg.RunDir
	}
	if cfg.ExecDrain <= 0 {
		cfg.ExecDrain = 2 * time.Second
	}
	if cfg.ExecQuiet <= 0 {
		cfg.ExecQuiet = 100 * time.Millisecond
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	a := &Agent{cfg: cfg, mux: http.NewServeMux(), py: pysession.NewManager(cfg.Python), start: time.Now()}
	m := a.mux
	m.HandleFunc("GET "+agentapi.PathInfo, a.handleInfo)
	m.HandleFunc("POST "+agentapi.PathIdentity, a.handleIdentity)
	m.HandleFunc("POST "+agentapi.PathExec, a.handleExec)
	m.HandleFunc("GET "+agentapi.PathFiles, a.handleReadFile)
	m.HandleFunc("PUT "+agentapi.PathFiles, a.handleWriteFile)
	m.HandleFunc("DELETE "+agentapi.PathFiles, a.handleRemove)
	m.HandleFunc("GET "+agentapi.PathFilesList, a.handleList)
	m.HandleFunc("GET "+agentapi.PathFilesStat, a.handleStat)
	m.HandleFunc("POST "+agentapi.PathFilesMkdir, a.handleMkdir)
	m.HandleFunc("POST "+agentapi.PathPythonStart, a.handlePythonStart)
	m.HandleFunc("POST "+agentapi.PathRunCode, a.handleRunCode)
	m.HandleFunc("POST "+agentapi.PathRehearse, a.handleRehearse)
	m.HandleFunc("POST "+agentapi.PathRunCodeStream, a.handleRunCodeStream)
	m.HandleFunc("POST "+agentapi.PathQuiesce, a.handleQuiesce)
	m.HandleFunc("POST "+agentapi.PathShutdown, a.handleShutdown)
	m.HandleFunc("GET "+agentapi.PathProcesses, a.handleListProcesses)
	m.HandleFunc("GET "+agentapi.PathChanges, a.handleChanges)
	m.HandleFunc("POST "+agentapi.PathProcesses+"/{pid}/stdin", a.handleProcessStdin)
	m.HandleFunc("POST "+agentapi.PathProcesses+"/{pid}/signal", a.handleProcessSignal)
	m.HandleFunc("POST "+agentapi.PathProcesses+"/{pid}/resize", a.handleProcessResize)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, fmt.Errorf("no such API: %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
	return a
}

func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Close stops what the agent started (the Python session).
func (a *Agent) Close() { a.py.Close() }

// OnHello applies a new host's identity; agentconn calls it before READY.
func (a *Agent) OnHello(h agentapi.Hello) (agentapi.Info, error) {
	// Bounded: a Python session stuck in user code is interrupted, then
	// killed, well within this.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.applyIdentity(ctx, h.Identity); err != nil {
		return agentapi.Info{}, err
	}
	return a.info(), nil
}

// applyIdentity makes this VM the sandbox id describes. Validation comes
// first so a bad identity changes nothing.
func (a *Agent) applyIdentity(ctx context.Context, id agentapi.Identity) error {
	t0 := time.Now()
	if err := identity.Validate(id); err != nil {
		return fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	if a.cfg.ApplySystemIdentity {
		if err := identity.ApplySystem(id); err != nil {
			return fmt.Errorf("applying identity: %v: %w", err, errdefs.ErrInternal)
		}
	}
	// Python's generators were seeded in the template: reseed before any
	// later run_code (the reseed queues behind one still running).
	if err := a.py.Reseed(ctx, identity.PythonSeed(id.Entropy)); err != nil {
		return err
	}
	a.mu.Lock()
	a.sandboxID = id.SandboxID
	a.applyMicros = time.Since(t0).Microseconds()
	a.mu.Unlock()
	return nil
}

func (a *Agent) info() agentapi.Info {
	a.mu.Lock()
	defer a.mu.Unlock()
	return agentapi.Info{
		AgentVersion:        a.cfg.Version,
		ProtocolVersion:     agentapi.Version,
		SandboxID:           a.sandboxID,
		Hostname:            identity.Hostname(),
		Kernel:              identity.KernelRelease(),
		UptimeMillis:        identity.Uptime().Milliseconds(),
		Python:              a.py.Running(),
		Features:            agentapi.AgentFeatures,
		IdentityApplyMicros: a.applyMicros,
	}
}

func (a *Agent) handleInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, a.info())
}

func (a *Agent) handleIdentity(w http.ResponseWriter, r *http.Request) {
	var id agentapi.Identity
	if err := readJSON(w, r, &id); err != nil {
		writeProblem(w, err)
		return
	}
	if err := a.applyIdentity(r.Context(), id); err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, a.info())
}

// defaultCwd is where processes start without a Cwd: the configured
// one, else HOME, if it exists.
func defaultCwd(cfgCwd string, env []string) string {
	if cfgCwd != "" {
		if fi, err := os.Stat(cfgCwd); err == nil && fi.IsDir() {
			return cfgCwd
		}
	}
	if home := procenv.Get(env, "HOME"); home != "" {
		if fi, err := os.Stat(home); err == nil && fi.IsDir() {
			return home
		}
	}
	return "/"
}
