// Command forkd is the forkd CLI and daemon. `forkd serve` owns every VMM
// process and serves the HTTP API on a Unix socket; every other command is a
// client of that API and starts a local daemon when none is running.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/api"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/jail"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// globals are the flags every command shares.
type globals struct {
	dataDir  string
	runDir   string
	socket   string
	host     string
	token    string
	caCert   string
	jsonOut  bool
	noStart  bool
	vmmName  string
	accel    string
	poolSize int
	// poolMax bounds how far a fan-out grows a snapshot's pool (--pool-max).
	poolMax int
	// poolStartOnly: pooled VMMs are not restored ahead (--pool-start-only).
	poolStartOnly bool
	maxFork       int
	maxSandboxes  int
	// guestMemShare bounds the guest memory committed to sandboxes, as
	// a multiple of the host's RAM (0: no bound).
	guestMemShare float64
	maxBuilds     int
	// sandboxTimeout is the lifetime of a sandbox whose fork names none;
	// deadRetention how long a dead one stays listed.
	sandboxTimeout, deadRetention time.Duration
	// poolIdle is how long an unused snapshot's pool keeps its VMMs.
	poolIdle time.Duration
	// readyTimeout bounds one child's restore and handshake.
	readyTimeout time.Duration
	// memoryBackend: how children's memory is restored (file or uffd).
	memoryBackend string
	// stopSandboxes: serve stops sandboxes on exit instead of leaving them
	// for the next daemon.
	stopSandboxes bool
	// liveBranch: clones map memory images on tmpfs (memoryDir) and QEMU
	// may create a userfaultfd, so live branches work.
	liveBranch bool
	memoryDir  string
	// diskReadMiBps and diskReadIOPS cap each sandbox's disk reads
	// (--disk-read-mbps, --disk-read-iops; 0: no limit).
	diskReadMiBps, diskReadIOPS int64
	// envErrs are environment values of flags that did not parse.
	envErrs []error
	// driverConfig is the config file's section for the chosen driver
	// ([driver.NAME], vmm.Options.Config; serve only).
	driverConfig map[string]any
	// noJail runs VMMs without their jail (--no-vmm-jail).
	noJail  bool
	network networkFlags
	// progress is --progress.
	progress progressFlags
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func main() {
	// A jail helper (a VMM's first moments) never returns from here.
	jail.Main()
	g := &globals{}
	root := newRootCmd(g)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := execute(ctx, root)
	stop()
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		printError(os.Stderr, err, g.jsonOut)
		os.Exit(exitCodeOf(err))
	}
}

// newRootCmd is the forkd command with every subcommand, its flags bound
// to g.
func newRootCmd(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "forkd",
		Short:         "forkd forks warmed microVM sandboxes in milliseconds",
		Long:          "forkd boots a microVM once, warms a runtime in it, snapshots it, and forks copy-on-write\nchildren from that snapshot, each its own VMM process in its own network namespace.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.dataDir, "data-dir", envOr("FORKD_DATA_DIR", "/var/lib/forkd"), "images and snapshots (env FORKD_DATA_DIR)")
	pf.StringVar(&g.runDir, "run-dir", envOr("FORKD_RUN_DIR", "/run/forkd"), "VMM sockets and consoles (env FORKD_RUN_DIR)")
	pf.StringVar(&g.socket, "socket", os.Getenv("FORKD_SOCKET"), "daemon API socket (env FORKD_SOCKET; default RUN_DIR/forkd.sock)")
	pf.StringVar(&g.host, "host", os.Getenv("FORKD_HOST"), "remote daemon URL https://HOST:PORT (env FORKD_HOST); default: the local socket")
	pf.StringVar(&g.token, "token", os.Getenv("FORKD_TOKEN"), "bearer token for --host; on the local socket, to act as the token's tenant under its quotas instead of as the socket's admin (env FORKD_TOKEN)")
	pf.StringVar(&g.caCert, "ca-cert", os.Getenv("FORKD_CA_CERT"), "PEM CA certificate of a --host daemon (env FORKD_CA_CERT)")
	pf.BoolVar(&g.jsonOut, "json", false, "print JSON for scripts (progress, if any, as NDJSON events on stderr)")
	addProgressFlag(pf, &g.progress)
	pf.BoolVar(&g.noStart, "no-autostart", os.Getenv("FORKD_NO_AUTOSTART") != "", "do not start a local daemon when none is running")

	root.AddCommand(
		serveCmd(g), daemonCmd(g),
		imageCmd(g), imagesCmd(g),
		snapshotCmd(g), snapshotsCmd(g), rmiCmd(g),
		packCmd(g), unpackCmd(g), pushCmd(g), pullCmd(g),
		dockerRunCmd(g), forkCmd(g), branchCmd(g), lsCmd(g), psCmd(g), killCmd(g), rmCmd(g), sandboxCmd(g),
		execCmd(g), shellCmd(g), runCodeCmd(g), cpCmd(g), systemCmd(g),
		doctorCmd(g), benchCmd(g), auditCmd(g), tokenCmd(g), tenantCmd(g), operationCmd(g),
	)
	root.AddCommand(mcpCmd(g))
	root.AddCommand(portCmd(g), portForwardCmd(g))
	guardGroups(root)
	applyExamples(root)
	registerCompletions(root, g)
	return root
}

// execute runs root's command line. An error from before the command's
// own code ran is cobra's: an unknown command or flag, a bad flag value,
// missing or extra arguments, a required flag not set. It is a usage
// error, classed invalid argument (exit 2; with --json a 400
// invalid_argument problem, not a 500), and says where the usage is.
func execute(ctx context.Context, root *cobra.Command) error {
	ran := false
	var mark func(*cobra.Command)
	mark = func(c *cobra.Command) {
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error {
				ran = true
				return run(cmd, args)
			}
		}
		for _, sub := range c.Commands() {
			mark(sub)
		}
	}
	mark(root)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil || ran {
		return err
	}
	return fmt.Errorf("%w (see `%s --help`): %w", err, cmd.CommandPath(), errdefs.ErrInvalidArgument)
}

// exitError carries a guest process's exit code out of a command.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// printError reports a command's error on w: a line of text, or with
// --json an RFC 9457 problem object (one line) carrying what the API's
// problem+json does, so a script reads stderr the way it reads the API.
func printError(w io.Writer, err error, asJSON bool) {
	if !asJSON {
		// Errors can quote a guest's console (a VM that died, an agent
		// that never answered).
		fmt.Fprintln(w, "forkd:", vmm.EscapeConsole(err.Error()))
		return
	}
	json.NewEncoder(w).Encode(problemOf(err))
}

// problemOf renders an error as a problem: a daemon's problem as the daemon
// sent it (with its request id), the detail being the whole message the
// CLI would print; any other error by its class, as the API renders one.
func problemOf(err error) apiv1.Problem {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return api.ProblemOf(err, "")
	}
	p := ce.Problem
	p.Detail = err.Error()
	if p.Status == 0 {
		p.Status = api.StatusOf(err)
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if p.Code == "" {
		p.Code = errdefs.Code(err)
	}
	if p.Type == "" {
		p.Type = api.ProblemOf(err, "").Type
	}
	return p
}

// exitCodeOf maps error classes to distinct exit codes for scripts.
func exitCodeOf(err error) int {
	switch {
	case errdefs.IsInvalidArgument(err):
		return 2
	case errdefs.IsNotFound(err):
		return 3
	case errdefs.IsUnavailable(err):
		return 4
	}
	return 1
}

func (g *globals) socketPath() string {
	if g.socket != "" {
		return g.socket
	}
	return filepath.Join(g.runDir, "forkd.sock")
}

// client returns an API client: of the --host daemon, or of the local one,
// which is started if none answers.
func (g *globals) client(ctx context.Context) (*client.Client, error) {
	if g.host != "" {
		return client.NewRemote(client.Remote{Host: g.host, Token: g.token, CACert: g.caCert})
	}
	c := client.New(g.socketPath()).WithToken(g.token)
	err := c.Ping(ctx)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, client.ErrDaemonNotRunning) || g.noStart {
		return nil, err
	}
	if err := g.startDaemon(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
