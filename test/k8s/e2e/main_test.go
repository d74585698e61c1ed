// Package e2e_test runs forkd's Kubernetes controller against real forkd
// daemons: a real etcd and kube-apiserver (testenv), the CRDs and the plain
// manifests of deploy/manifests applied to them, and two nodes simulated by
// `bin/forkd serve`, each in a network namespace of its own with a veth to
// the test's, found by the controller's real PodDiscovery through Pod
// objects this test writes as a kubelet would.
//
// It needs root (network namespaces, taps), QEMU and bin/ (make build);
// without root or QEMU it skips unless FORKD_K8S_REQUIRED=1.
package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/test/k8s/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// repoRoot is the checkout, three levels above this package's directory
// (go test runs a test in its package's directory).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// sharedDataDir is the data dir the integration tests keep their image
// caches in (integration/main_test.go); this test seeds its node's cache
// with the guest kernel and busybox package found there.
func sharedDataDir() string {
	if d := os.Getenv("FORKD_TEST_DATA_DIR"); d != "" {
		return d
	}
	return "/var/tmp/forkd-test"
}

// requireNodes checks what the simulated nodes need: root, QEMU and ip(8)
// skip the test when missing (unless FORKD_K8S_REQUIRED=1); bin/forkd and
// bin/forkd-agent missing fail it, naming make build.
func requireNodes(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "the simulated nodes need root (network namespaces, taps, nftables): run `sudo make test-k8s`")
	}
	for _, bin := range []string{"qemu-system-x86_64", "ip", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing(t, "the simulated nodes need "+bin+": run `make deps`")
		}
	}
	for _, bin := range []string{"forkd", "forkd-agent"} {
		if _, err := os.Stat(filepath.Join(repoRoot(t), "bin", bin)); err != nil {
			t.Fatalf("bin/%s is missing (%v): run `make build` (make test-k8s does)", bin, err)
		}
	}
}

// optionalTool finds the tool name a part of a test needs, else fails
// the test saying why it is needed (FORKD_K8S_REQUIRED=1), or logs that
// the part is skipped and returns false.
func optionalTool(t *testing.T, name, why string) (string, bool) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path, true
	}
	if os.Getenv(testenv.RequiredEnv) == "1" {
		t.Fatalf("%s: install %s (scripts/install-deps.sh)", why, name)
	}
	t.Logf("no %s: %s, skipped", name, why)
	return "", false
}

func missing(t *testing.T, why string) {
	t.Helper()
	if os.Getenv(testenv.RequiredEnv) == "1" {
		t.Fatal(why)
	}
	t.Skip(why)
}
