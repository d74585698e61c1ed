package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// TestCgroupV2InGuest runs internal/cgroup's live conformance suite
// (TestHostLive: limits written, OOM kill reported, pids.max and cpu.max
// enforced, clone3 placement, cleanup) on a pure cgroup v2 kernel. This
// host is hybrid, its memory, CPU and pids controllers held by v1, so
// the suite runs inside a sandbox: its guest kernel (Debian's) mounts
// cgroup2 with every controller, and the suite's static test binary
// runs there as root. What it checks is the kernel's v2 behaviour
// against forkd's v2 code, as a v2 host would.
func TestCgroupV2InGuest(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cgroup.test")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(gobin, "test", "-c", "-o", bin, "./internal/cgroup")
	build.Dir, build.Env = repoRoot, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the cgroup test binary: %v\n%s", err, out)
	}
	payload, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}

	e := newEngine(t, 0)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	a := agentOf(t, e, sbs[0].ID)
	if _, err := a.WriteFile(ctx, "/tmp/cgroup.test", 0o755, bytes.NewReader(payload)); err != nil {
		t.Fatal(err)
	}
	if got := run(t, a, "sh", "-c", "mount -t cgroup2 none /sys/fs/cgroup && cat /sys/fs/cgroup/cgroup.controllers"); !containsAll(got, "cpu", "memory", "pids", "io") {
		t.Fatalf("guest cgroup2 controllers %q: want cpu, memory, pids and io", got)
	}
	var out, errb bytes.Buffer
	ev, err := a.Exec(ctx, agentapi.ExecRequest{
		Argv: []string{"/tmp/cgroup.test", "-test.run", "^TestHostLive$", "-test.v", "-test.timeout", "10m"},
		Cwd:  "/tmp", TimeoutMillis: (12 * time.Minute).Milliseconds(),
	}, nil, &out, &errb)
	t.Logf("in the guest:\n%s%s", out.String(), errb.String())
	if err != nil || ev.ExitCode != 0 {
		t.Fatalf("cgroup conformance on the guest's v2: exit %d, %v", ev.ExitCode, err)
	}
	for _, want := range []string{"host layout: v2", "--- PASS: TestHostLive/OOMReported", "--- PASS: TestHostLive/PidsMax", "--- PASS: TestHostLive/CPUQuota"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the guest's run does not say %q", want)
		}
	}
}

// containsAll reports whether every word is one of s's fields.
func containsAll(s string, words ...string) bool {
	have := strings.Fields(s)
	for _, w := range words {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
