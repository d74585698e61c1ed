package bench

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/state"
)

// runEnv is the engine of one bench run and what it owns.
type runEnv struct {
	e        *sandbox.Engine
	say      sayFunc
	runDir   string
	dataDir  string // DATA_DIR/.bench-state-PID
	st       *state.Store
	watchdog *exec.Cmd
	alive    *os.File // the watchdog's pipe: open while this run lives
}

// newEnv reaps what dead bench runs left, starts the watchdog, then this
// run's engine: the daemon's (a state store fsynced on every fork, on the
// same file system as the daemon's), in its own run dir and namespaces,
// its sandboxes stopped when it closes. m may be nil.
func newEnv(c Config, name string, m *metrics.Metrics) (_ *runEnv, err error) {
	pid := os.Getpid()
	b := &runEnv{
		say:     newSay(c.Progress),
		runDir:  runDirOf(c.RunDir, name, pid),
		dataDir: dataDirOf(c.DataDir, "state", pid),
	}
	reapStale(c.RunDir, c.DataDir, b.say)
	if b.alive, b.watchdog, err = startWatchdog(c.Watchdog); err != nil {
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
	b.e, err = c.NewEngine(EngineOptions{
		RunDir: b.runDir, NetNSPrefix: netNSPrefix(pid), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		State: b.st, Metrics: m, PoolSize: c.PoolSize, PoolStartOnly: c.PoolStartOnly,
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// close stops every sandbox and VMM of the run and removes its files.
func (b *runEnv) close() {
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
func (b *runEnv) release() {
	if b.st != nil {
		b.st.Close()
	}
	if n := killVMMsUnder(b.runDir); n > 0 {
		b.say("killed %d VMM(s) of this run that were still running", n)
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
