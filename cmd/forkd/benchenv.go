package main

// The environment of a `forkd bench` run: its own engine, a watchdog that
// cleans up after it however it ends, and the reaping of what earlier runs
// left behind.
//
// A bench run owns RUN_DIR/bench-NAME-PID (its VMMs' run files),
// network namespaces named fkbPID-… and DATA_DIR/.bench-*-PID (its state
// store, bench api's audit log). The pid in every name is what lets a later
// run tell a dead run's leftovers from a live concurrent run's.
//
// Why a watchdog process and not the VMMs' parent-death signal (the QEMU
// driver's Config.KillOnParentDeath): QEMU drops to an unprivileged uid
// (-runas) right after it starts, and Linux clears a process's
// parent-death signal when its uids change, so a bench killed with SIGKILL
// would leave every VMM running. The watchdog holds the read end of a pipe
// whose only writer is the bench process; the kernel closes it when the
// bench dies, by any signal.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/vmm/qemu"
)

var (
	// benchRunDirRe matches a bench run dir in RUN_DIR: bench-PID (older
	// runs of bench spawn) or bench-NAME-PID.
	benchRunDirRe = regexp.MustCompile(`^bench-(?:[a-z]+-)?([0-9]+)$`)
	// benchNetNSRe matches a bench run's namespaces.
	benchNetNSRe = regexp.MustCompile(`^fkb([0-9]+)-`)
	// benchOldNetNSRe matches namespaces of bench runs from before the pid
	// was in the name.
	benchOldNetNSRe = regexp.MustCompile(`^fk[ab]-`)
	// benchTableRe matches a bench engine's host table (egress.Host).
	benchTableRe = regexp.MustCompile(`^forkd-fkb([0-9]+)$`)
	// benchDataDirRe matches a bench run's dirs in DATA_DIR.
	benchDataDirRe = regexp.MustCompile(`^\.bench-[a-z-]+-([0-9]+)$`)
)

// benchNetNSPrefix starts the namespace names of this process's engine.
func benchNetNSPrefix(pid int) string { return fmt.Sprintf("fkb%d-", pid) }

// benchAlive reports whether pid is a running forkd bench (or this process).
// A pid that now belongs to another program counts as dead.
func benchAlive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	argv, err := procfs.ReadCmdline(pid)
	if err != nil {
		return false
	}
	return strings.HasPrefix(filepath.Base(argv[0]), "forkd") && slices.Contains(argv, "bench")
}

// otherBenchRunning reports whether a forkd bench other than this process runs.
func otherBenchRunning() bool {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil && pid != os.Getpid() && benchAlive(pid) {
			return true
		}
	}
	return false
}

// killVMMsUnder sends SIGKILL to every VMM process whose run dir lies
// under dir/vms/ (qemu.VMMsUnder: a process that merely names a path
// there, a `tail -f` of a console log, is left alone), and returns how many
// it signalled. QEMU is the driver bench runs; a Firecracker driver will
// list its own VMMs the same way (vmm.Lister).
func killVMMsUnder(dir string) int {
	n := 0
	for _, v := range qemu.VMMsUnder(filepath.Join(dir, "vms")) {
		if syscall.Kill(v.PID, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// reapStaleBenchRuns removes what bench runs that are gone left behind: it
// kills their VMMs, then removes their run dirs, network namespaces and
// data-dir files. Runs still alive (another bench at the same time) are
// left alone. say reports each removal.
func reapStaleBenchRuns(runDir, dataDir string, say func(string, ...any)) {
	reapBenchRuns(runDir, dataDir, func(pid int) bool { return !benchAlive(pid) }, true, say)
}

// reapBenchRuns removes the VMMs, run dirs, namespaces and data-dir files
// of the bench runs whose pid gone reports as gone; namespaces named
// without a pid (older runs) too when oldStyle is set and no other bench
// runs.
func reapBenchRuns(runDir, dataDir string, gone func(pid int) bool, oldStyle bool, say func(string, ...any)) {
	entries, _ := os.ReadDir(runDir)
	for _, ent := range entries {
		m := benchRunDirRe.FindStringSubmatch(ent.Name())
		if m == nil || !ent.IsDir() {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); !gone(pid) {
			continue
		}
		dir := filepath.Join(runDir, ent.Name())
		killed := killVMMsUnder(dir)
		if err := os.RemoveAll(dir); err != nil {
			say("could not remove %s, left by a bench run that is gone: %v", dir, err)
			continue
		}
		say("removed %s and killed its %d VMM(s), left by a bench run that is gone", dir, killed)
	}
	names, _ := netns.List("fk")
	others := -1 // unknown until an old-style name needs it
	for _, n := range names {
		if m := benchNetNSRe.FindStringSubmatch(n); m != nil {
			if pid, _ := strconv.Atoi(m[1]); !gone(pid) {
				continue
			}
		} else if oldStyle && benchOldNetNSRe.MatchString(n) {
			// No pid in the name: only safe when no other bench runs.
			if others < 0 {
				others = 0
				if otherBenchRunning() {
					others = 1
				}
			}
			if others == 1 {
				continue
			}
		} else {
			continue
		}
		ns, err := netns.Open(n, netns.DefaultTap)
		if err == nil {
			err = ns.Remove()
		}
		if err != nil {
			say("could not remove network namespace %s, left by a bench run that is gone: %v", n, err)
			continue
		}
		say("removed network namespace %s, left by a bench run that is gone", n)
	}
	// Host tables in this namespace (a run given --network-host-netns left
	// its table there, with the namespace it was given).
	tables, _ := egress.HostTables("")
	for _, name := range tables {
		m := benchTableRe.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); !gone(pid) {
			continue
		}
		if err := egress.RemoveHostTable("", name); err == nil {
			say("removed nftables table %s, left by a bench run that is gone", name)
		}
	}
	entries, _ = os.ReadDir(dataDir)
	for _, ent := range entries {
		m := benchDataDirRe.FindStringSubmatch(ent.Name())
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); !gone(pid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dataDir, ent.Name())); err == nil {
			say("removed %s, left by a bench run that is gone", filepath.Join(dataDir, ent.Name()))
		}
	}
}

// watchdogFD is the descriptor the watchdog reads its owner's pipe from
// (the first of exec.Cmd.ExtraFiles).
const watchdogFD = 3

// startBenchWatchdog starts `forkd bench watchdog` for this process: in a
// session of its own (a signal to the terminal's process group does not
// reach it), it waits until this process has exited and then removes what
// this run owns. The returned pipe end must stay open for as long as this
// process runs; closing it ends the watchdog (after it finds nothing left).
func startBenchWatchdog(g *globals) (*os.File, *exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe() // close-on-exec: no VMM or tool inherits w
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	cmd := exec.Command(self, "--run-dir", g.runDir, "--data-dir", g.dataDir, "bench", "watchdog", "--owner", strconv.Itoa(os.Getpid()))
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("start the bench watchdog: %w", err)
	}
	return w, cmd, nil
}

func benchWatchdogCmd(g *globals) *cobra.Command {
	var owner int
	cmd := &cobra.Command{
		Use:    "watchdog --owner PID",
		Short:  "Wait until a bench run has exited, then remove its VMMs, namespaces and files (started by bench itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if owner <= 0 {
				return fmt.Errorf("--owner: the pid of the bench run: %w", errdefs.ErrInvalidArgument)
			}
			// Read returns EOF once the owner's end is closed: when it
			// exits, however it exits. Its signals (SIGINT at a
			// terminal) are not this process's business.
			signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
			io.Copy(io.Discard, os.NewFile(watchdogFD, "bench-owner"))
			reapBenchRuns(g.runDir, g.dataDir, func(pid int) bool { return pid == owner }, false, func(string, ...any) {})
			return nil
		},
	}
	cmd.Flags().IntVar(&owner, "owner", 0, "pid of the bench run to clean up after")
	return cmd
}

// benchEnv is the engine of one bench run and what it owns.
type benchEnv struct {
	e        *sandbox.Engine
	runDir   string
	dataDir  string // DATA_DIR/.bench-state-PID
	st       *state.Store
	watchdog *exec.Cmd
	alive    *os.File // the watchdog's pipe: open while this run lives
}

// newBenchEnv reaps what dead bench runs left, starts the watchdog, then
// this run's engine: the daemon's (a state store fsynced on every fork, on
// the same file system as the daemon's), in its own run dir and
// namespaces, its sandboxes stopped when it closes. m may be nil.
func newBenchEnv(g *globals, name string, m *metrics.Metrics) (_ *benchEnv, err error) {
	pid := os.Getpid()
	reapStaleBenchRuns(g.runDir, g.dataDir, benchSay)
	b := &benchEnv{
		runDir:  filepath.Join(g.runDir, fmt.Sprintf("bench-%s-%d", name, pid)),
		dataDir: filepath.Join(g.dataDir, fmt.Sprintf(".bench-state-%d", pid)),
	}
	if b.alive, b.watchdog, err = startBenchWatchdog(g); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	if b.st, err = state.Open(filepath.Join(b.dataDir, "state.db")); err != nil {
		return nil, err
	}
	g.maxFork = 1000
	g.stopSandboxes = true
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b.e, _, err = g.newEngine(engineDeps{runDir: b.runDir, netnsPrefix: benchNetNSPrefix(pid), log: log, state: b.st, metrics: m})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// close stops every sandbox and VMM of the run and removes its files.
func (b *benchEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.e.Close(ctx)
	b.release()
}

// release removes the run's files and ends the watchdog, which then finds
// nothing left to clean. A VMM the engine did not stop (a close that ran
// out of time, a pool refill or background branch still starting one) is
// killed first: once the run dir is gone, nothing would find it by its
// command line.
func (b *benchEnv) release() {
	if b.st != nil {
		b.st.Close()
	}
	if n := killVMMsUnder(b.runDir); n > 0 {
		benchSay("killed %d VMM(s) of this run that were still running", n)
	}
	os.RemoveAll(b.runDir)
	os.RemoveAll(b.dataDir)
	b.alive.Close()
	done := make(chan struct{})
	go func() { b.watchdog.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}
