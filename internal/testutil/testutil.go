// Package testutil holds the helpers forkd's tests share to decide whether
// they can run: privileges, binaries and devices.
//
// Privileged tests skip when the process lacks what they need, unless
// FORKD_TEST_PRIVILEGED=1 is set (as in a CI shard that runs them as root),
// in which case a missing prerequisite fails the test instead of silently
// skipping it.
package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// PrivilegedEnv is the environment variable that turns a missing
// prerequisite of a privileged test from a skip into a failure.
const PrivilegedEnv = "FORKD_TEST_PRIVILEGED"

// Capabilities forkd's privileged tests need (bits of CapEff).
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// Unavailable skips t, or fails it when privileged tests were requested
// (PrivilegedEnv): for a test whose host lacks what it needs.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(PrivilegedEnv) == "1" {
		t.Fatalf("%s (and %s=1 requires it)", msg, PrivilegedEnv)
	}
	t.Skip(msg)
}

// RequiresRoot skips t unless the process has CAP_SYS_ADMIN and
// CAP_NET_ADMIN (namespaces, mounts, tap devices), as root normally does.
func RequiresRoot(t testing.TB) {
	t.Helper()
	caps, err := effectiveCaps()
	if err != nil {
		Unavailable(t, "requires root: reading capabilities: %v", err)
		return
	}
	for _, c := range []struct {
		bit  uint
		name string
	}{{capSysAdmin, "CAP_SYS_ADMIN"}, {capNetAdmin, "CAP_NET_ADMIN"}} {
		if caps&(1<<c.bit) == 0 {
			Unavailable(t, "requires root (%s; running as uid %d)", c.name, os.Geteuid())
			return
		}
	}
}

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}

// RequiresBinary skips t unless name is found in PATH, and returns its
// path.
func RequiresBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "requires %s in PATH", name)
	}
	return p
}

// RequiresKVM skips t unless /dev/kvm can be opened for reading and
// writing by the current user.
func RequiresKVM(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		Unavailable(t, "requires a usable /dev/kvm for uid %d: %v", os.Geteuid(), err)
		return
	}
	f.Close()
}

// FakeVMM returns a command for a process that only sleeps, for seconds,
// yet has a QEMU command line with the given arguments (the arguments
// after a Python script are ignored). It runs the system's interpreter
// itself: a version-manager shim (pyenv) forks helper processes that
// carry the same arguments for a moment, and a test counting the
// processes that look like VMMs would count those too.
func FakeVMM(seconds int, qemuArgs ...string) *exec.Cmd {
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		python = "python3"
	}
	args := append([]string{"-c", fmt.Sprintf("import time; time.sleep(%d)", seconds)}, qemuArgs...)
	return exec.Command(python, args...)
}
