package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestClients runs the clients that live outside Go against one real
// daemon with two snapshots: the Python SDK's pytest suite, the TypeScript
// SDK's node --test suite, the MCP end-to-end test (the official TypeScript
// MCP SDK driving `forkd mcp` over stdio) and the agent recipes that need
// no pandas. Each gets FORKD_SOCKET, FORKD_TEST_TAG (minimal), FORKD_TEST_PY_TAG
// (python3 with a warmed session) and FORKD_BIN, as scripts/sdk-test-env.sh
// gives them by hand.
func TestClients(t *testing.T) {
	c := newCLI(t)
	c.env = append(c.env, "FORKD_RECIPES="+filepath.Join(repoRoot, "recipes")+":"+filepath.Join(repoRoot, "integration", "testdata"))
	id := snapshot.NewID()
	minTag, pyTag := "it-sdk-min-"+id, "it-sdk-py-"+id
	c.ok("snapshot", "create", "--tag", minTag, "--recipe", "minimal")
	c.ok("snapshot", "create", "--tag", pyTag, "--recipe", "py-min")
	t.Cleanup(func() { c.run("rmi", "--cascade", minTag, pyTag) })
	env := append(append([]string{}, c.env...),
		"FORKD_SOCKET="+filepath.Join(c.runDir, "forkd.sock"),
		"FORKD_TEST_TAG="+minTag, "FORKD_TEST_PY_TAG="+pyTag,
		"FORKD_BIN="+filepath.Join(repoRoot, "bin", "forkd"),
		"PYTHONDONTWRITEBYTECODE=1",
	)
	// The limits only bound a hang: each suite boots many sandboxes, under
	// TCG on a busy CI host several times slower than idle (the Python
	// suite takes about 1.5 min on an idle 2-CPU host).
	runIn := func(t *testing.T, dir string, timeout time.Duration, name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = filepath.Join(repoRoot, dir)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
			}
		case <-time.After(timeout):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%s %s in %s: still running after %v\n%s", name, strings.Join(args, " "), dir, timeout, out.String())
		}
		t.Logf("%s %s:\n%s", name, strings.Join(args, " "), tail(out.String(), 3000))
	}
	npm := func(t *testing.T, dir string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(repoRoot, dir, "node_modules")); err != nil {
			runIn(t, dir, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund")
		}
		runIn(t, dir, 10*time.Minute, "npm", "test")
	}
	t.Run("python-sdk", func(t *testing.T) {
		runIn(t, "sdk/python", 10*time.Minute, "/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	})
	t.Run("typescript-sdk", func(t *testing.T) { npm(t, "sdk/typescript") })
	t.Run("mcp-e2e", func(t *testing.T) { npm(t, "integration/mcp-e2e") })
	t.Run("recipes", func(t *testing.T) {
		for _, r := range []string{"parallel_tests.py", "branch_and_explore.py"} {
			runIn(t, "recipes/agents", 6*time.Minute, "/usr/bin/python3", r, "--tag", pyTag)
		}
	})
	if left := c.sandboxes(); len(left) > 0 {
		t.Errorf("clients left %d sandboxes running", len(left))
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
