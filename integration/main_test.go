// Package integration boots real microVMs (TCG here, KVM where usable)
// through forkd's engine, its HTTP API and its CLI. It needs root, QEMU and
// the image-building tools; `make test` installs them and builds bin/.
package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/jail"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
	_ "github.com/forkd-dev/forkd/internal/vmm/qemu"
)

var (
	repoRoot string
	dataDir  string // shared across runs: caches kernel, busybox and root fs builds
)

func TestMain(m *testing.M) {
	jail.Main() // engines in this process jail their VMMs with this binary
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Dir(filepath.Dir(file))
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "integration tests need root (network namespaces, taps): run `sudo make test`")
		os.Exit(1)
	}
	for _, bin := range []string{"qemu-system-x86_64", "mkfs.ext4", "apt-get"} {
		if _, err := exec.LookPath(bin); err != nil {
			fmt.Fprintf(os.Stderr, "integration tests need %s: run `make deps`\n", bin)
			os.Exit(1)
		}
	}
	for _, bin := range []string{"bin/forkd", "bin/forkd-agent"} {
		if _, err := os.Stat(filepath.Join(repoRoot, bin)); err != nil {
			fmt.Fprintf(os.Stderr, "integration tests need %s: run `make build`\n", bin)
			os.Exit(1)
		}
	}
	dataDir = os.Getenv("FORKD_TEST_DATA_DIR")
	if dataDir == "" {
		dataDir = "/var/tmp/forkd-test"
	}
	os.Exit(m.Run())
}

// newEngine starts an engine with its own run dir and namespace prefix over
// the shared data dir, and closes it when the test ends.
func newEngine(t *testing.T, poolSize int) *sandbox.Engine {
	t.Helper()
	return newEngineOn(t, dataDir, poolSize)
}

// newEngineOn is newEngine over another data dir; opts adjust the config.
func newEngineOn(t *testing.T, data string, poolSize int, opts ...func(*sandbox.Config)) *sandbox.Engine {
	t.Helper()
	ctor, err := vmm.Lookup("qemu")
	if err != nil {
		t.Fatal(err)
	}
	drv, err := ctor.New(vmm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("/run", "forkd-it-")
	if err != nil {
		t.Fatal(err)
	}
	prefix := "fkt" + snapshot.NewID()[:4] + "-"
	cfg := sandbox.Config{
		DataDir: data, RunDir: runDir, Driver: drv,
		RecipeDirs:  []string{filepath.Join(repoRoot, "recipes"), filepath.Join(repoRoot, "integration", "testdata")},
		AgentBinary: filepath.Join(repoRoot, "bin", "forkd-agent"),
		PoolSize:    poolSize, NetNSPrefix: prefix, MaxForkCount: 20,
		// A busy CI machine (TCG, 2 cores, other jobs) can starve a child
		// past the product's 90 s; the tests wait for it to answer.
		ReadyTimeout: 5 * time.Minute,
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, o := range opts {
		o(&cfg)
	}
	e, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close(context.Background())
		os.RemoveAll(runDir)
	})
	return e
}

// newTemplate creates a snapshot with a unique tag and removes it at the end.
func newTemplate(t *testing.T, e *sandbox.Engine, recipe string) *snapshot.Snapshot {
	t.Helper()
	tag := "it-" + recipe + "-" + snapshot.NewID()
	snap, err := e.CreateSnapshot(context.Background(), sandbox.CreateSnapshotOptions{
		Tag: tag, Recipe: recipe, Progress: func(m string) { t.Log(m) },
	})
	if err != nil {
		t.Fatalf("create snapshot from %s: %v", recipe, err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), tag) })
	return snap
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

var _ io.Writer = testWriter{}
