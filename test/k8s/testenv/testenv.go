// Package testenv starts a real control plane (etcd and kube-apiserver, no
// nodes, no controllers) for tests, through controller-runtime's envtest.
//
// The binaries come from scripts/k8s-testenv.sh, which builds them from the
// Go module proxy at the versions pinned in this module's go.mod and prints
// the directory to put in KUBEBUILDER_ASSETS. Without it the tests skip.
//
// The control plane listens on 127.0.0.1, so a test binary that uses it
// calls Main from TestMain: Main re-runs the binary in a network namespace
// of its own (unshare --net), where 127.0.0.1 is private to the test.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const (
	// AssetsEnv names the directory holding etcd and kube-apiserver.
	AssetsEnv = "KUBEBUILDER_ASSETS"
	// RequiredEnv set to 1 turns a missing prerequisite into a failure
	// instead of a skip (make test-k8s sets it), so the suite cannot pass
	// by not running.
	RequiredEnv = "FORKD_K8S_REQUIRED"
	// netnsEnv marks the re-run child; netnsErrEnv carries why there is none.
	netnsEnv    = "FORKD_K8S_NETNS"
	netnsErrEnv = "FORKD_K8S_NETNS_ERR"

	// Each component gets this long to answer its health check. envtest's
	// default (20 s) is too short on a loaded 2-core machine, where a cold
	// kube-apiserver takes several seconds before /healthz answers.
	startTimeout = 3 * time.Minute
	stopTimeout  = time.Minute
)

// Main runs m inside a private network namespace and exits with its code.
// When no namespace can be made (not root and no user namespaces), the tests
// run here and Start skips them, naming the reason.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv(netnsEnv) == "1" {
		if err := loopbackUp(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: bring up lo in the private network namespace: %v\n", err)
			return 1
		}
		return m.Run()
	}
	args, err := unshareArgs()
	if err != nil {
		os.Setenv(netnsErrEnv, err.Error())
		return m.Run()
	}
	cmd := exec.Command(args[0], append(append(args[1:], os.Args[0]), os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "testenv: re-run the tests in a private network namespace: %v\n", err)
		return 1
	}
	return 0
}

// unshareArgs returns the unshare command line that gives a child its own
// network namespace, after checking that it works here.
func unshareArgs() ([]string, error) {
	bin, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("unshare(1) not found: install util-linux")
	}
	args := []string{bin, "--net", "--"}
	if os.Geteuid() != 0 {
		args = []string{bin, "--user", "--map-root-user", "--net", "--"}
	}
	if out, err := exec.Command(args[0], append(args[1:], "true")...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s cannot make a network namespace (%v: %s): run as root", args[0], err, out)
	}
	return args, nil
}

// loopbackUp sets lo up; a new network namespace starts with it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// Start starts etcd and kube-apiserver for t and stops them when t ends.
// It returns the environment (for InstallCRDs, AddUser) and an admin
// rest.Config. It skips t when the binaries or a private network namespace
// are missing, unless FORKD_K8S_REQUIRED=1.
func Start(t testing.TB) (*envtest.Environment, *rest.Config) {
	t.Helper()
	assets := os.Getenv(AssetsEnv)
	if assets == "" {
		missing(t, AssetsEnv+" is not set: run `export "+AssetsEnv+"=$(scripts/k8s-testenv.sh)` or `make test-k8s`")
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, name)); err != nil {
			missing(t, fmt.Sprintf("%s=%s has no %s (%v): rebuild it with scripts/k8s-testenv.sh", AssetsEnv, assets, name, err))
		}
	}
	if os.Getenv(netnsEnv) != "1" {
		why := os.Getenv(netnsErrEnv)
		if why == "" {
			why = "the test binary's TestMain does not call testenv.Main"
		}
		missing(t, "no private network namespace for the control plane: "+why)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
	}
	// The components' output is kept and shown only when start-up fails.
	var out tailBuffer
	env.ControlPlane.Etcd = &envtest.Etcd{Out: &out, Err: &out}
	api := env.ControlPlane.GetAPIServer()
	api.Out, api.Err = &out, &out
	// The private namespace has no default route, from which kube-apiserver
	// would otherwise pick the address it advertises for the kubernetes
	// Service, and it exits at once without one. 127.0.0.1 is refused by the
	// endpoint reconciler, which keeps that Service's endpoints: with no
	// nodes and no pods there is nothing to route to them, so it is off.
	api.Configure().Set("advertise-address", "127.0.0.1")
	api.Configure().Set("endpoint-reconciler-type", "none")
	began := time.Now()
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start etcd and kube-apiserver from %s: %v\nlast output:\n%s", assets, err, out.String())
	}
	t.Logf("control plane ready in %v", time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	return env, cfg
}

// tailBuffer keeps the last tailMax bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 16 << 10

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > tailMax {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-tailMax:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatal(why)
	}
	t.Skip(why)
}
