package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/api"
	"github.com/forkd-dev/forkd/internal/apisock"
	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/sdnotify"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// installDirs are where forkd looks for forkd-agent and recipes/, relative
// to its own binary: next to it and its parent (bin/forkd in a checkout),
// then PREFIX/lib/forkd and PREFIX/share/forkd for PREFIX/bin/forkd (`make
// install` with any PREFIX, the .deb's /usr, an unpacked release tarball),
// then the package's own paths.
func installDirs() []string {
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	exe, _ = filepath.EvalSymlinks(exe)
	return installDirsOf(exe)
}

func installDirsOf(exe string) []string {
	bin := filepath.Dir(exe)
	prefix := filepath.Dir(bin)
	return []string{bin, prefix, filepath.Join(prefix, "lib", "forkd"), filepath.Join(prefix, "share", "forkd"), "/usr/lib/forkd", "/usr/share/forkd"}
}

func agentBinary() (string, error) {
	if p := os.Getenv("FORKD_AGENT"); p != "" {
		return p, nil
	}
	for _, d := range installDirs() {
		p := filepath.Join(d, "forkd-agent")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("forkd-agent not found next to forkd; run `make build` or set FORKD_AGENT: %w", errdefs.ErrFailedPrecondition)
}

func recipeDirs(dataDir string) []string {
	var dirs []string
	if d := os.Getenv("FORKD_RECIPES"); d != "" {
		dirs = append(dirs, strings.Split(d, ":")...)
	}
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, filepath.Join(wd, "recipes"))
	}
	for _, d := range installDirs() {
		dirs = append(dirs, filepath.Clean(filepath.Join(d, "recipes")))
	}
	return append(dirs, filepath.Join(dataDir, "recipes"))
}

// engineDeps are what the daemon (or `forkd bench`) gives its engine
// besides the flags.
type engineDeps struct {
	runDir      string
	netnsPrefix string
	log         *slog.Logger
	state       *state.Store     // nil: nothing survives a restart (bench)
	metrics     *metrics.Metrics // nil: no metrics
	onEvent     func(sandbox.Event)
}

// newEngine builds the engine the daemon (and `forkd bench`) runs. With a
// state store, sandboxes are recorded and re-adopted across restarts.
func (g *globals) newEngine(d engineDeps) (*sandbox.Engine, vmm.Constructor, error) {
	if err := errors.Join(g.envErrs...); err != nil {
		return nil, vmm.Constructor{}, err
	}
	if g.diskReadMiBps < 0 || g.diskReadMiBps > 1<<20 || g.diskReadIOPS < 0 || g.diskReadIOPS > 1<<30 {
		return nil, vmm.Constructor{}, fmt.Errorf("--disk-read-mbps %d, --disk-read-iops %d: want 0 (no limit) to 1048576 MiB/s and 0 to 2^30 reads/s: %w",
			g.diskReadMiBps, g.diskReadIOPS, errdefs.ErrInvalidArgument)
	}
	if os.Geteuid() != 0 {
		return nil, vmm.Constructor{}, fmt.Errorf("the forkd daemon needs root (network namespaces, tap devices); run it with sudo: %w", errdefs.ErrFailedPrecondition)
	}
	ctor, err := vmm.Lookup(g.vmmName)
	if err != nil {
		return nil, ctor, err
	}
	drv, err := ctor.New(vmm.Options{Accel: vmm.Accel(g.accel), Logger: d.log, NoJail: g.noJail, Config: g.driverConfig})
	if err != nil {
		return nil, ctor, err
	}
	warnIfEmulated(d.log, drv, vmm.Accel(g.accel))
	agent, err := agentBinary()
	if err != nil {
		return nil, ctor, err
	}
	memDir, err := g.liveBranchSetup(d.log, drv)
	if err != nil {
		return nil, ctor, err
	}
	netCfg, err := g.network.config()
	if err != nil {
		return nil, ctor, err
	}
	maxGuestMiB, err := guestMemoryLimit(g.guestMemShare)
	if err != nil {
		return nil, ctor, err
	}
	e, err := sandbox.New(sandbox.Config{
		MemoryDir: memDir,
		DataDir:   g.dataDir, RunDir: d.runDir, Driver: drv, Accel: vmm.Accel(g.accel),
		RecipeDirs: recipeDirs(g.dataDir), AgentBinary: agent, PoolSize: g.poolSize, PoolMax: g.poolMax, PoolStartOnly: g.poolStartOnly, PoolIdle: g.poolIdle,
		NetNSPrefix: d.netnsPrefix, Logger: d.log, MaxForkCount: g.maxFork, ReadyTimeout: g.readyTimeout, MemoryBackend: memoryBackend(g.memoryBackend), MaxSandboxes: g.maxSandboxes, MaxGuestMemoryMiB: maxGuestMiB,
		MaxConcurrentBuilds: g.maxBuilds, Metrics: d.metrics, OnEvent: d.onEvent, DeadRetention: g.deadRetention,
		State: d.state, KeepSandboxesOnClose: d.state != nil && !g.stopSandboxes,
		Network:  netCfg,
		DiskRead: vmm.RateLimit{BytesPerSec: g.diskReadMiBps << 20, OpsPerSec: g.diskReadIOPS},
	})
	return e, ctor, err
}

func serveCmd(g *globals) *cobra.Command {
	var netnsPrefix, configPath, logLevel, portDomain, trustedKeys, socketGroup string
	var privateRegistries []string
	var listen, tlsCert, tlsKey, tokenFile string
	var insecure bool
	var maxConns int
	var maxConnsEnvErr error
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon in the foreground (owns every VMM; API on a Unix socket)",
		Long: "Run the daemon in the foreground. Settings come from flags, then the config file\n" +
			"(--config, default " + defaultConfigPath + " when it exists; keys are flag names with _ for -),\n" +
			"then defaults.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			explicit := cmd.Flags().Changed("config")
			if configPath == "" {
				configPath = defaultConfigPath
			}
			drivers, err := applyConfig(cmd, configPath, explicit)
			if err != nil {
				return err
			}
			g.driverConfig = drivers[g.vmmName]
			if maxConnsEnvErr != nil {
				return fmt.Errorf("FORKD_MAX_CONNECTIONS=%q: %v: %w", os.Getenv("FORKD_MAX_CONNECTIONS"), maxConnsEnvErr, errdefs.ErrInvalidArgument)
			}
			if maxConns < 0 {
				return fmt.Errorf("--max-connections %d: want 0 (no limit) or more: %w", maxConns, errdefs.ErrInvalidArgument)
			}
			trusted, err := loadTrustedKeys(trustedKeys)
			if err != nil {
				return err
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error: %w", logLevel, errdefs.ErrInvalidArgument)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if err := os.MkdirAll(g.runDir, 0o700); err != nil {
				return err
			}
			sock := g.socketPath()
			if err := client.New(sock).Ping(ctx); err == nil {
				return fmt.Errorf("a forkd daemon already answers on %s: %w", sock, errdefs.ErrAlreadyExists)
			}
			os.Remove(sock) // stale socket of a dead daemon
			if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
				return err
			}
			st, err := state.Open(filepath.Join(g.dataDir, "state.db"))
			if err != nil {
				return err
			}
			defer st.Close()
			// The pid file is written as soon as this process owns the
			// state (no other daemon can): adopting many sandboxes takes
			// a while before the socket listens, and `forkd daemon stop`
			// must find a daemon that is still starting.
			pidFile := g.pidPath()
			os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
			defer os.Remove(pidFile)
			// The audit log opens before the engine, so lifecycle events
			// seen while adopting sandboxes are recorded too. Its anchor
			// (the newest record's seq and hash) lives in the state file:
			// a log cut from its end, or deleted, stops the start here
			// with the missing records and the fix.
			alog, err := audit.Open(filepath.Join(g.dataDir, "audit"), audit.Options{Logger: log, Anchor: st})
			if err != nil {
				return err
			}
			defer alog.Close()
			m := metrics.New(version)
			// The server exists before the engine: lifecycle events go
			// through its audit gate (a failed write refuses mutating
			// requests until one succeeds) from the first adoption on.
			srv := &api.Server{Version: version, Log: log, Metrics: m, Audit: alog, PortDomain: strings.ToLower(strings.Trim(portDomain, ".")), TrustedKeys: trusted, PrivateRegistries: privateRegistries,
				DefaultTimeout: g.sandboxTimeout}
			if len(trusted) > 0 {
				log.Info("import policy: archives must be signed by a trusted key", "keys", len(trusted))
			}
			e, ctor, err := g.newEngine(engineDeps{runDir: g.runDir, netnsPrefix: netnsPrefix, log: log, state: st, metrics: m, onEvent: srv.EngineEvent})
			if err != nil {
				return err
			}
			srv.Engine = e
			srv.Checks = func(ctx context.Context) []vmm.Check {
				return ctor.Checks(ctx, vmm.Options{Accel: vmm.Accel(g.accel), NoJail: g.noJail, Config: g.driverConfig})
			}
			m.SetStateFunc(e.MetricsState)
			m.SetFilesystems(daemonFilesystems(g.dataDir, g.runDir, e.Config().MemoryDir)...)
			// The token store is open without --listen too: a request on
			// the socket that presents a token acts as its tenant, under
			// its quotas; `forkd token create` may add one at any time.
			if tokenFile == "" {
				tokenFile = filepath.Join(g.dataDir, auth.StoreFile)
			}
			var tln net.Listener
			var created bool
			first := filepath.Join(g.dataDir, auth.FirstTokenFile)
			if listen != "" {
				created, err = auth.EnsureFirst(tokenFile, first)
			}
			if err == nil {
				srv.Tokens, err = auth.Open(tokenFile)
				if err != nil && listen == "" {
					// The socket serves without tokens: a bad store
					// refuses only requests that present one, until
					// it is fixed (reloaded on the next one).
					log.Warn("token store unreadable: requests on the socket that present a token are refused until it is fixed", "file", tokenFile, "err", err)
					err = nil
				}
			}
			if err == nil && listen != "" {
				tln, err = auth.Listen(auth.ListenConfig{Addr: listen, CertFile: tlsCert, KeyFile: tlsKey, Insecure: insecure})
			}
			if err != nil {
				e.Close(context.Background())
				return err
			}
			if created {
				log.Info("created the first API token; clients read it from the file", "file", first)
			}
			if err := srv.LoadState(st); err != nil {
				e.Close(context.Background())
				return err
			}
			access := apisock.Resolve(socketGroup)
			ln, err := apisock.Listen(sock, g.runDir, access)
			if err != nil {
				e.Close(context.Background())
				return err
			}
			if access.GID >= 0 {
				log.Info("API socket open to a group: its members are root-equivalent on this host", "group", access.Group, "mode", fmt.Sprintf("%04o", access.Mode))
			} else {
				log.Info("API socket is root only: users need sudo", "reason", access.RootOnly)
			}
			hs := api.NewHTTPServer(srv.Handler(), maxConns)
			hs.RegisterOnShutdown(srv.CloseStreams)
			errc := make(chan error, 2)
			go func() { errc <- hs.Serve(ln) }()
			if tln != nil {
				go func() { errc <- hs.Serve(tln) }()
				log.Info("forkd API listening on TCP", "addr", tln.Addr().String(), "tls", tlsCert != "")
			}
			log.Info("forkd daemon listening", "socket", sock, "data_dir", g.dataDir, "vmm", g.vmmName, "pid", os.Getpid())
			// Ready for a Type=notify unit: sandboxes left by the last
			// daemon are adopted and the API answers.
			if _, err := sdnotify.Notify(sdnotify.Ready, sdnotify.Status("serving on "+sock)); err != nil {
				log.Warn("could not tell the service manager the daemon is ready", "err", err)
			}
			select {
			case err = <-errc:
			case <-ctx.Done():
				if g.stopSandboxes {
					log.Info("shutting down: finishing in-flight requests, stopping sandboxes")
				} else {
					log.Info("shutting down: finishing in-flight requests; sandboxes keep running for the next daemon")
				}
			}
			sdnotify.Notify(sdnotify.Stopping)
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			hs.Shutdown(sctx)
			e.Close(sctx)
			os.Remove(sock)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			return err
		},
	}
	f := cmd.Flags()
	addDriverFlags(f, g, "")
	addPoolFlags(f, g, "pre-started VMM processes kept per snapshot")
	f.DurationVar(&g.poolIdle, "pool-idle", sandbox.DefaultPoolIdle,
		"stop the pooled VMMs of a snapshot no fork has used for this long (its next fork refills the pool); 0: keep them")
	f.StringVar(&configPath, "config", "", "TOML config file (default "+defaultConfigPath+" if present)")
	f.StringVar(&logLevel, "log-level", envOr("FORKD_LOG_LEVEL", "info"),
		"debug, info, warn or error (env FORKD_LOG_LEVEL); debug adds every API request with its duration, each VMM start, and each branch's and snapshot's timings")
	f.StringVar(&netnsPrefix, "netns-prefix", envOr("FORKD_NETNS_PREFIX", "forkd-"), "prefix of the network namespaces this daemon creates (and cleans up at start)")
	f.IntVar(&g.maxFork, "max-fork", 100, "most sandboxes one fork request may create")
	f.DurationVar(&g.readyTimeout, "ready-timeout", sandbox.DefaultReadyTimeout,
		"most time one child's restore and agent handshake may take before its fork fails (env FORKD_READY_TIMEOUT); raise it on hosts that run large fan-outs under emulation with little CPU")
	envDefault(f, g, "ready-timeout", "FORKD_READY_TIMEOUT")
	f.IntVar(&g.maxSandboxes, "max-sandboxes", 0, "most sandboxes running at once (0: no limit)")
	f.Float64Var(&g.guestMemShare, "guest-memory-share", defaultGuestMemShare,
		"most guest memory committed to sandboxes running, starting and pooled, as a multiple of the host's RAM; a fork past it is refused (429) with the numbers. Above 1 because clones share their parent's memory copy-on-write and few touch all of theirs. 0: no limit")
	f.IntVar(&g.maxBuilds, "max-builds", 2, "most image builds and snapshot creations at once (a tenant without a max_builds quota: all but one)")
	f.DurationVar(&g.sandboxTimeout, "sandbox-timeout", api.DefaultSandboxTimeout,
		"lifetime of a sandbox whose fork names none (fork --timeout, the API's timeout_s): a leaked one is reclaimed; 0: no limit")
	f.DurationVar(&g.deadRetention, "dead-retention", time.Hour,
		"how long a sandbox whose VMM died stays listed, with why it died, before it is forgotten (0: until killed)")
	f.StringVar(&socketGroup, "socket-group", envOr("FORKD_SOCKET_GROUP", apisock.DefaultGroup),
		"group whose members may use the API socket (mode 0660; membership is root-equivalent on this host, like the docker group); when it does not exist the socket is root only (0600). Empty: root only (env FORKD_SOCKET_GROUP)")
	f.StringVar(&listen, "listen", "", "also serve the API on TCP HOST:PORT (bearer tokens always; TLS required off loopback)")
	f.StringVar(&tlsCert, "tls-cert", "", "PEM certificate (chain) for --listen")
	f.StringVar(&tlsKey, "tls-key", "", "PEM private key for --listen")
	f.StringVar(&tokenFile, "token-file", "", "hashed API token store (default DATA_DIR/"+auth.StoreFile+"); the first token's plaintext goes to DATA_DIR/"+auth.FirstTokenFile)
	f.BoolVar(&insecure, "insecure-no-tls-or-auth-i-know", false, "allow --listen on a non-loopback address without TLS (tokens stay required)")
	f.IntVar(&maxConns, "max-connections", api.DefaultMaxConnections,
		"most API connections served at once on each listener (the Unix socket, --listen), so a flood of them cannot exhaust the daemon; more wait to be accepted. Tunnels and WebSockets to sandbox ports stop counting once upgraded. 0: no limit (env FORKD_MAX_CONNECTIONS)")
	if v := os.Getenv("FORKD_MAX_CONNECTIONS"); v != "" {
		// The default, as envOr gives the string flags theirs: the
		// config file and the command line still win.
		maxConnsEnvErr = f.Lookup("max-connections").Value.Set(v)
	}
	f.BoolVar(&g.stopSandboxes, "stop-sandboxes", false, "stop every sandbox when the daemon stops (default: they keep running and the next daemon re-adopts them)")
	addVMMFlags(f, g)
	addNetworkFlags(f, &g.network)
	f.StringSliceVar(&privateRegistries, "registry-private", nil,
		"registries (HOST or HOST:PORT, as in a pull's reference) that tenants may pull snapshots from although they are at loopback or private addresses; others must be public (an admin may pull from any)")
	f.StringVar(&trustedKeys, "trusted-keys", "", "import policy: refuse archives (`forkd unpack`, POST /v1/snapshots/import) not signed by one of these ed25519 public keys: comma-separated KEYBASE.pub files of `forkd pack keygen`, or directories of them")
	f.StringVar(&portDomain, "port-domain", "", "route requests for the host PORT-ID.DOMAIN (e.g. 8080-sb-0123456789.sandbox.example.com, a wildcard DNS name pointing at --listen) to that sandbox's port, whole paths included")
	return cmd
}

// envDefault makes the environment variable env the default of flag, as
// for --max-connections: the config file and the command line still win;
// a value that does not parse fails the engine's start (newEngine).
func envDefault(f *pflag.FlagSet, g *globals, flag, env string) {
	if v := os.Getenv(env); v != "" {
		if err := f.Lookup(flag).Value.Set(v); err != nil {
			g.envErrs = append(g.envErrs, fmt.Errorf("%s=%q: %v: %w", env, v, err, errdefs.ErrInvalidArgument))
		}
	}
}

// addLiveBranchFlags adds --live-branch and --memory-dir, and
// --no-vmm-jail.
func addVMMFlags(f *pflag.FlagSet, g *globals) {
	f.BoolVar(&g.noJail, "no-vmm-jail", os.Getenv("FORKD_NO_VMM_JAIL") == "1",
		"run VMMs without their jail and cgroup (private root, PID, IPC and UTS namespaces, rlimits, capabilities; memory, CPU and task limits; env FORKD_NO_VMM_JAIL=1): weaker isolation, for hosts that lack a namespace or cgroup controller; forkd doctor reports it")
	f.Int64Var(&g.diskReadMiBps, "disk-read-mbps", defaultDiskReadMiBps,
		"most MiB per second a sandbox reads from its root disk (env FORKD_DISK_READ_MBPS; 0: no limit); its disk is read-only, its writes stay in its memory")
	f.Int64Var(&g.diskReadIOPS, "disk-read-iops", defaultDiskReadIOPS,
		"most reads per second a sandbox makes from its root disk (env FORKD_DISK_READ_IOPS; 0: no limit)")
	f.StringVar(&g.memoryBackend, "memory-backend", "file",
		"how a child's memory is restored (env FORKD_MEMORY_BACKEND): file maps the snapshot's memory image copy-on-write (a diff chain is assembled into one image first); uffd serves it page by page from the snapshot's layers through forkd's userfaultfd page server (Firecracker only; its children cannot be adopted by a restarted daemon)")
	envDefault(f, g, "memory-backend", "FORKD_MEMORY_BACKEND")
	envDefault(f, g, "disk-read-mbps", "FORKD_DISK_READ_MBPS")
	envDefault(f, g, "disk-read-iops", "FORKD_DISK_READ_IOPS")
	f.BoolVar(&g.poolStartOnly, "pool-start-only", os.Getenv("FORKD_POOL_START_ONLY") == "1",
		"keep pooled VMMs started but not restored (env FORKD_POOL_START_ONLY=1). By default they are restored ahead and rehearse a first request (the snapshot's [python] rehearse code) in a throwaway copy of their session, so a child answers its fork with one identity call and its first request runs warm; each pooled child is then a running guest")
	f.BoolVar(&g.liveBranch, "live-branch", os.Getenv("FORKD_LIVE_BRANCH") == "1",
		"enable live branches (env FORKD_LIVE_BRANCH=1): clones map memory images kept on tmpfs (--memory-dir, RAM), and QEMU may create a userfaultfd (QEMU 8.1+ in its jail: from a /dev/userfaultfd node of its own uid; QEMU 7.2 or --no-vmm-jail: sets vm.unprivileged_userfaultfd=1)")
	f.StringVar(&g.memoryDir, "memory-dir", os.Getenv("FORKD_MEMORY_DIR"),
		"tmpfs or hugetlbfs directory for the memory images clones map (env FORKD_MEMORY_DIR; default with --live-branch: /dev/shm/forkd-<hash of the data dir>). On hugetlbfs a live branch pauses about 1 ms at 256 MiB and 1 GiB alike (on tmpfs it grows with memory), and each sandbox reserves its guest memory in huge pages: size /proc/sys/vm/nr_hugepages for the images plus the running and pooled VMMs")
}

// memoryBackend is the engine's name of a --memory-backend value; the
// engine refuses one it does not know, naming the choices.
func memoryBackend(flag string) vmm.MemoryBackend {
	if flag == "file" {
		return vmm.MemoryBackendFile
	}
	return vmm.MemoryBackend(flag)
}

// liveBranchSetup returns the memory dir the engine uses ("" for the data
// dir) and, for --live-branch, has the driver set up the host for live
// snapshots (vmm.LiveBranchHost: QEMU's userfaultfd).
func (g *globals) liveBranchSetup(log *slog.Logger, drv vmm.Driver) (string, error) {
	if log == nil {
		log = slog.Default()
	}
	dir := g.memoryDir
	if g.liveBranch && dir == "" {
		sum := sha256.Sum256([]byte(g.dataDir))
		dir = fmt.Sprintf("/dev/shm/forkd-%x", sum[:4])
	}
	if dir == "" {
		return "", nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("--memory-dir: %w", err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return "", fmt.Errorf("--memory-dir: %w", err)
	}
	onTmpfs := sfs.Type == unix.TMPFS_MAGIC || sfs.Type == unix.HUGETLBFS_MAGIC
	if g.liveBranch && !onTmpfs {
		return "", fmt.Errorf("--memory-dir %s is not on tmpfs or hugetlbfs (live branches write-protect guest memory with userfaultfd, which needs shmem): pick one, such as /dev/shm/forkd: %w", dir, errdefs.ErrInvalidArgument)
	}
	if sfs.Type == unix.HUGETLBFS_MAGIC {
		log.Info("memory dir on hugetlbfs: each image and each sandbox (running or pooled) takes its guest memory in huge pages from the host's pool",
			"dir", dir, "page_bytes", sfs.Bsize, "pool", "HugePages_Free in /proc/meminfo")
	}
	if h, ok := drv.(vmm.LiveBranchHost); ok && g.liveBranch {
		if err := h.SetupLiveBranches(log); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// daemonFilesystems are the directories whose file systems /metrics
// reports: the data directory (snapshots, images, state, audit log), the
// run directory (sockets, VMM run files) and, for live branches, the
// guest memory directory (tmpfs or hugetlbfs; "" when not used).
func daemonFilesystems(dataDir, runDir, memDir string) []metrics.Filesystem {
	fs := []metrics.Filesystem{{Dir: "data", Path: dataDir}, {Dir: "run", Path: runDir}}
	if memDir != "" {
		fs = append(fs, metrics.Filesystem{Dir: "memory", Path: memDir})
	}
	return fs
}

// warnIfEmulated says at start-up, plainly, that guests run under TCG
// when they do: software emulation is no security boundary (QEMU's
// security policy counts only guests under KVM as isolated).
func warnIfEmulated(log *slog.Logger, drv vmm.Driver, accel vmm.Accel) {
	resolver, ok := drv.(interface {
		Accel(vmm.Accel) (vmm.Accel, error)
	})
	if !ok {
		return
	}
	if a, err := resolver.Accel(accel); err == nil && a == vmm.AccelTCG {
		log.Warn("guests run under TCG software emulation (no usable /dev/kvm): slow, and not a security boundary; use KVM to run untrusted code (docs/SECURITY.md)")
	}
}

// defaultGuestMemShare lets the guest memory committed reach 1.5 times
// the host's RAM: a clone maps its snapshot's memory copy-on-write and
// rarely writes all of it (a child of the minimal snapshot is 18 % of a
// cold VM, docs/BENCHMARKS.md), but a default without any bound would let
// a fan-out commit many times the host and end in its OOM killer.
const defaultGuestMemShare = 1.5

// Default per-sandbox disk read limits: well above what a sandbox reading
// its image needs, well below what one disk gives a host.
const (
	defaultDiskReadMiBps = 256
	defaultDiskReadIOPS  = 10000
)

// guestMemoryLimit turns --guest-memory-share into MiB of this host's
// RAM (0: no limit).
func guestMemoryLimit(share float64) (int64, error) {
	if share < 0 || share > 100 {
		return 0, fmt.Errorf("--guest-memory-share %g: want 0 (no limit) to 100 times the host's RAM: %w", share, errdefs.ErrInvalidArgument)
	}
	if share == 0 {
		return 0, nil
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("host memory: %w", err)
	}
	ram := uint64(si.Totalram) * uint64(si.Unit)
	return int64(float64(ram>>20) * share), nil
}
