// Package sandbox is forkd's engine: it turns recipes into warmed template
// snapshots and forks running sandboxes from them.
//
// One Engine lives in the daemon and owns every VMM process it starts. The
// engine is split by lifecycle phase: template.go creates snapshots, spawn.go
// restores children (the fork path), pool.go keeps pre-started VMM processes
// per snapshot, sandbox.go tracks running sandboxes and their deaths, and
// guest.go proxies agent operations (exec, files, run_code).
package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Config configures an Engine.
type Config struct {
	DataDir string // images, snapshots (persistent)
	RunDir  string // VMM sockets and consoles (tmpfs, per boot)
	Driver  vmm.Driver
	// Accel is passed to the driver (empty: auto).
	Accel vmm.Accel
	// RecipeDirs are searched for recipes by name.
	RecipeDirs []string
	// AgentBinary is the static forkd-agent put into images as /init.
	AgentBinary string
	// PoolSize is the number of pre-started VMM processes kept per snapshot.
	// 0 disables the pool (every fork starts its VMM on the critical path).
	PoolSize int
	// PoolMax bounds how far a fan-out grows a snapshot's pool: a fork
	// of n children raises it to n, at most PoolMax, for the next fan-out
	// (pool.go). PoolMax <= PoolSize keeps pools at PoolSize.
	PoolMax int
	// PoolStartOnly keeps pooled VMMs started but not restored: a fork
	// then restores its VMM and the child's first request translates its
	// code itself. By default pooled VMMs are restored ahead and rehearse
	// their first request (ahead.go).
	PoolStartOnly bool
	// PoolIdle drains the pool of a snapshot not forked for this long: its
	// waiting VMMs are stopped, and its next fork starts one on its path
	// and refills the pool (0: pools are never drained).
	PoolIdle time.Duration
	// MaxForkCount bounds N in one fork request.
	MaxForkCount int
	// MaxSandboxes bounds running sandboxes (0: unlimited).
	MaxSandboxes int
	// MaxGuestMemoryMiB bounds the guest memory committed to sandboxes
	// running, starting and pooled (0: unlimited); see admission.go.
	MaxGuestMemoryMiB int64
	// SpawnConcurrency bounds children restored at once (0: 2 x CPUs).
	SpawnConcurrency int
	// ReadyTimeout bounds one child's restore plus agent handshake (0:
	// DefaultReadyTimeout). Tests on busy machines raise it.
	ReadyTimeout time.Duration
	// MemoryBackend is how children's memory is restored: the file
	// backend maps the snapshot's memory image copy-on-write (a diff
	// chain is assembled into one image first); vmm.MemoryBackendUffd
	// serves each child's memory page by page from the snapshot's chain
	// (pageserver.go), where the driver offers it (Firecracker).
	MemoryBackend vmm.MemoryBackend
	// DiskRead caps each sandbox's reads of its root disk (zero fields: no
	// limit). Templates boot without it: a build reads its whole image.
	DiskRead vmm.RateLimit
	// MaxConcurrentBuilds bounds image builds and snapshot creations running
	// at once (0: 2); more are refused as ResourceExhausted, not queued.
	MaxConcurrentBuilds int
	// NetNSPrefix starts the name of every network namespace this engine
	// creates (default "forkd-"); leftovers with it are removed at start.
	// Engines sharing a host (daemon, benchmark, tests) use distinct ones.
	NetNSPrefix string
	Logger      *slog.Logger
	// Metrics, if set, receives fork-to-ready, VMM phase and agent call
	// timings (a nil *metrics.Metrics records nothing).
	Metrics *metrics.Metrics
	// OnEvent, if set, is told about lifecycle events (events.go), in the
	// goroutine where they happen: it must not block.
	OnEvent func(Event)
	// DeadRetention is how long a dead sandbox stays listed, with why it
	// died, before it is forgotten (0: until killed).
	DeadRetention time.Duration
	// State, if set, records every sandbox durably, so a restarted daemon
	// re-adopts running VMMs instead of killing them.
	State *state.Store
	// KeepSandboxesOnClose leaves sandbox VMMs running when the engine
	// closes (a daemon restart re-adopts them). Pooled VMMs always go.
	KeepSandboxesOnClose bool
	// MemoryDir, if set, holds the memory images clones map: a copy of
	// each flat snapshot's (made on first use) and the assembled images of
	// chain heads, by digest, instead of the data dir. On tmpfs it makes
	// live branches possible (userfaultfd write-protection covers shmem,
	// not private mappings of files on disk), at the price of keeping
	// those images in RAM.
	MemoryDir string
	// Network configures sandbox networking: the default egress policy,
	// the uplink pool, the host namespace and the DNS upstream.
	Network NetworkConfig
}

// Engine owns sandboxes, pools and the snapshot store.
type Engine struct {
	cfg Config
	// clockSlack: see greetAgent.
	clockSlack time.Duration
	log        *slog.Logger
	store      *snapshot.Store
	builder    *image.Builder
	mem        *memCache
	spawnSem   chan struct{}
	buildSem   chan struct{}
	branchSem  chan struct{}

	// mu guards the fields below.
	mu        sync.Mutex
	net       *network
	sandboxes map[string]*Sandbox
	pools     map[string]*pool            // by snapshot ID
	pending   map[string]*PendingSnapshot // background branches, by tag
	closed    bool
	// starting counts the MaxSandboxes slots reserved by forks in flight,
	// startingMiB the guest memory they reserved (reserveSlots).
	starting    int
	startingMiB int64
	// tenantStarting is what forks in flight reserved, by tenant
	// (reserveTenant).
	tenantStarting map[string]TenantUsage
	// tenantBuilds counts the build slots each tenant holds (builds.go).
	tenantBuilds map[string]int
	// tainted holds, by snapshot ID, why a snapshot whose files changed
	// after commit is refused (checkIntact).
	tainted map[string]string

	// bg tracks daemon-owned work (background branches, Go), which Close
	// waits for.
	bg sync.WaitGroup
	// discards tracks VMMs being stopped off the caller's goroutine
	// (discardLater), which Close waits for too.
	discards discardTracker
	// life is the engine's lifetime context: daemon-owned work runs on
	// it, never on the request that started it. Close cancels it (with
	// ErrEngineClosed) once it stops waiting for that work.
	life    context.Context
	endLife context.CancelCauseFunc

	stopJanitor context.CancelFunc
}

// DefaultPoolSize keeps two VMM processes ready per snapshot: enough to take
// QEMU's start-up off the critical path of sequential forks without holding
// much memory (a waiting QEMU is ~20 MB).
const DefaultPoolSize = 2

// DefaultPoolMax lets a fan-out grow a snapshot's pool to 16 VMMs for
// the next one (each a running guest: ~1.5 % of a core under TCG, and
// its guest memory counted by admission) until fan-outs stop coming.
const DefaultPoolMax = 16

// DefaultPoolIdle is how long a snapshot's pool waits for a fork before
// it is drained: each waiting child costs guest memory and a little CPU
// (~1.5 % of a core under TCG), which a snapshot forked once should not
// hold for the daemon's life.
const DefaultPoolIdle = 30 * time.Minute

// New opens the stores and removes what a previous daemon left behind.
func New(cfg Config) (*Engine, error) {
	if cfg.Driver == nil {
		return nil, fmt.Errorf("engine: no VMM driver: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.NetNSPrefix == "" {
		cfg.NetNSPrefix = "forkd-"
	}
	if cfg.MaxForkCount <= 0 {
		cfg.MaxForkCount = 100
	}
	if cfg.MaxConcurrentBuilds <= 0 {
		cfg.MaxConcurrentBuilds = 2
	}
	if cfg.SpawnConcurrency <= 0 {
		cfg.SpawnConcurrency = 2 * runtime.NumCPU()
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if err := checkMemoryBackend(cfg.MemoryBackend, cfg.Driver); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	for _, d := range []string{cfg.DataDir, cfg.RunDir, filepath.Join(cfg.RunDir, "vms")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	store, err := snapshot.Open(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	memDir := filepath.Join(cfg.DataDir, "cache", "memory")
	if cfg.MemoryDir != "" {
		memDir = cfg.MemoryDir
	}
	mem, err := newMemCache(memDir, filepath.Join(cfg.DataDir, "cache", "memory-stamps"))
	if err != nil {
		return nil, err
	}
	nw, err := newNetwork(cfg.Network, cfg.NetNSPrefix, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		net:        nw,
		mem:        mem,
		cfg:        cfg,
		log:        cfg.Logger,
		store:      store,
		builder:    &image.Builder{DataDir: cfg.DataDir, AgentBinary: cfg.AgentBinary},
		spawnSem:   make(chan struct{}, cfg.SpawnConcurrency),
		buildSem:   make(chan struct{}, cfg.MaxConcurrentBuilds),
		branchSem:  make(chan struct{}, maxConcurrentBranches),
		clockSlack: defaultClockSlack,
		sandboxes:  map[string]*Sandbox{},
		pools:      map[string]*pool{},
		pending:    map[string]*PendingSnapshot{},
		tainted:    map[string]string{},
	}
	e.builder.Steps = stepRunner{e: e}
	e.life, e.endLife = context.WithCancelCause(context.Background())
	keep := e.adoptRecorded()
	e.reapLeftovers(keep)
	e.pruneMemoryCache()
	jctx, cancel := context.WithCancel(e.life)
	e.stopJanitor = cancel
	go e.janitor(jctx)
	return e, nil
}

// Store exposes the snapshot store (read-only use by the API).
func (e *Engine) Store() *snapshot.Store { return e.store }

// Driver returns the VMM driver.
func (e *Engine) Driver() vmm.Driver { return e.cfg.Driver }

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Close releases the engine: pooled VMMs are discarded; sandboxes are
// stopped, or with KeepSandboxesOnClose left running for the next daemon
// to adopt (their state is recorded).
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.stopJanitor()
	pools := slices.Collect(maps.Values(e.pools))
	sbs := make([]*Sandbox, 0, len(e.sandboxes))
	for _, s := range e.sandboxes {
		sbs = append(sbs, s)
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Add(1)
		go func() { defer wg.Done(); p.close(ctx) }()
	}
	for _, s := range sbs {
		// A page-served sandbox cannot outlive its page server, which
		// ends with the engine: it is stopped even when the rest stay.
		if !e.cfg.KeepSandboxesOnClose || s.pageServed {
			wg.Add(1)
			go func() { defer wg.Done(); s.kill(ctx, "daemon shutting down"); e.unpersist(s) }()
		}
	}
	wg.Wait()
	// VMMs a pool or a fork let go of (shrink, eviction, a dead one
	// taken) are gone before Close returns, not left to a goroutine.
	if err := e.discards.wait(ctx); err != nil {
		e.log.Warn("pooled VMMs still stopping at shutdown", "vmms", e.discards.pending(), "err", err)
	}
	// Background work (branches, operations) commits or fails; none is
	// left half-written either way, but waiting lets what is nearly done
	// land. What is still running when ctx ends is cancelled, and given
	// a moment to remove its staging.
	done := make(chan struct{})
	go func() { e.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		e.endLife(ErrEngineClosed)
		select {
		case <-done:
		case <-time.After(closeCancelGrace):
		}
	}
	e.endLife(ErrEngineClosed)
	e.net.Close()
	if !e.cfg.KeepSandboxesOnClose {
		// Every sandbox ended with the engine: nothing needs the host's
		// rules any more.
		if err := e.net.RemoveHost(); err != nil {
			e.log.Warn("removing the host's sandbox network rules", "err", err)
		}
	}
	return nil
}

// LoadRecipe finds a recipe by name in RecipeDirs. Paths are refused:
// the API must not read files of the daemon host it is asked to; a client
// with a recipe file sends its contents (ResolveRecipe, recipe_toml).
func (e *Engine) LoadRecipe(name string) (*recipe.Recipe, error) {
	if strings.ContainsAny(name, `/\`) || strings.HasSuffix(name, ".toml") {
		return nil, fmt.Errorf("recipe %q looks like a path: name a recipe in %v, or send the file's contents as recipe_toml (the CLI does that for a path): %w",
			name, e.cfg.RecipeDirs, errdefs.ErrInvalidArgument)
	}
	return recipe.Load(name, e.cfg.RecipeDirs)
}

// ResolveRecipe returns the recipe named name, or parses toml; exactly one
// must be given.
func (e *Engine) ResolveRecipe(name, toml string) (*recipe.Recipe, error) {
	switch {
	case name != "" && toml != "":
		return nil, fmt.Errorf("give a recipe name or recipe_toml, not both: %w", errdefs.ErrInvalidArgument)
	case toml != "":
		return recipe.Parse("recipe_toml", []byte(toml))
	case name == "":
		return nil, fmt.Errorf("no recipe: give a recipe name (known: %s) or recipe_toml: %w",
			strings.Join(recipe.Names(e.cfg.RecipeDirs), ", "), errdefs.ErrInvalidArgument)
	}
	return e.LoadRecipe(name)
}

// BuildImage builds (or finds cached) the image of a recipe.
func (e *Engine) BuildImage(ctx context.Context, r *recipe.Recipe, progress func(string)) (*image.Image, error) {
	return e.BuildImageWith(ctx, nil, r, BuildOptions{Progress: progress})
}

// BuildOptions are one image build's.
type BuildOptions struct {
	// Progress, if set, receives the build's messages and the output of
	// its Run steps.
	Progress func(string)
	// Network is the egress policy of its build VMs; nil: the daemon's
	// default.
	Network *egress.Policy
	// Registry is how it pulls its from image (zero: the daemon's docker
	// config, any address); Tenant, for a tenant's build, scopes its
	// step cache.
	Registry image.RegistryAccess
	Tenant   string
}

// CheckBuildNetwork checks a build's network policy before the build
// starts, so a bad one is a plain 4xx.
func (e *Engine) CheckBuildNetwork(p *egress.Policy) error { return e.checkBuildNetwork(p) }

// BuildImageWith is BuildImage in a slot the caller took with
// TryAcquireBuild (for a tenant, with its quota); it releases the slot
// when it returns. A nil slot: it takes one itself for the operator,
// bound by MaxConcurrentBuilds only (or fails with ResourceExhausted).
func (e *Engine) BuildImageWith(ctx context.Context, slot *BuildSlot, r *recipe.Recipe, opts BuildOptions) (*image.Image, error) {
	if slot == nil {
		var err error
		if slot, err = e.TryAcquireBuild("build image "+r.Name, "", TenantQuota{}); err != nil {
			return nil, err
		}
	}
	defer slot.Release()
	if err := e.checkBuildNetwork(opts.Network); err != nil {
		return nil, err
	}
	return e.builderFor(opts).Build(ctx, r)
}

// Images lists built images, newest first.
func (e *Engine) Images() ([]*image.Image, error) {
	imgs, err := image.List(e.cfg.DataDir)
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].Created.After(imgs[j].Created) })
	return imgs, err
}

// RemoveSnapshot deletes a tag once no sandbox creation is using its pool.
// Running children keep working: their VMMs hold the memory file open.
func (e *Engine) RemoveSnapshot(ctx context.Context, tag string) error {
	snap, err := e.store.Get(tag)
	if err != nil {
		return err
	}
	e.DropPool(ctx, snap.ID)
	e.mu.Lock()
	delete(e.tainted, snap.ID)
	e.mu.Unlock()
	return e.store.Remove(tag)
}

// DropPool discards the VMMs pooled for a snapshot id (its tag was
// replaced or removed outside RemoveSnapshot).
func (e *Engine) DropPool(ctx context.Context, snapshotID string) {
	e.mu.Lock()
	p := e.pools[snapshotID]
	delete(e.pools, snapshotID)
	e.mu.Unlock()
	if p != nil {
		p.close(ctx)
	}
}

// PoolSize reports pre-started VMMs waiting for a snapshot.
func (e *Engine) PoolSize(snapshotID string) int {
	p := e.poolOf(snapshotID)
	if p == nil {
		return 0
	}
	return p.ready()
}

func since(t time.Time) float64 { return millis(time.Since(t)) }
