// Package testguest gives VMM tests a real guest: Debian's cloud kernel
// (fetched once through image.FetchKernel and cached) and a tiny initramfs
// made of the host's static busybox and a shell script as /init, built in
// the test in a few milliseconds.
//
// The init script (AgentInit) loads the virtio modules, configures eth0 as
// netns.GuestAddr/30 when a NIC is present, prints "tick N" to the console
// every second and serves a line protocol on the virtio-serial port named
// "agent":
//
//	ping        -> pong
//	set VALUE   -> ok           (stores VALUE in guest memory, /tmp/state)
//	get         -> state=VALUE
//	run CMD     -> CMD's output on one line (stdout and stderr)
//	anything    -> echo: anything
//
// It is a stand-in for forkd-agent that keeps VMM tests independent of it.
// A VM without that port (Firecracker, whose agent channel is vsock) gets
// the same protocol from vsockagent on vsock port 1024, built by Initramfs
// from this module.
package testguest

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/image/cpio"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// CacheEnv names a directory for the test kernel cache (default: the
// user's cache directory + "/forkd-test"). The first use downloads the
// Debian cloud kernel package with apt.
const CacheEnv = "FORKD_TEST_CACHE"

// Modules are the kernel modules the test initramfs loads, in order.
var Modules = []string{"virtio_ring", "virtio", "virtio_mmio", "virtio_console", "failover", "net_failover", "virtio_net"}

// VsockModules are loaded, after Modules, only in a VM without the agent
// port, before vsockagent starts.
var VsockModules = []string{"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport"}

// Kernel returns the cached guest kernel, fetching it on first use. It
// skips the test when apt cannot provide it (unless privileged tests were
// requested, see testutil.PrivilegedEnv).
func Kernel(t testing.TB) *image.Kernel {
	t.Helper()
	dir := os.Getenv(CacheEnv)
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		dir = filepath.Join(base, "forkd-test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, err := image.FetchKernel(ctx, dir, func(s string) { t.Logf("kernel: %s", s) })
	if err != nil {
		msg := fmt.Sprintf("guest kernel unavailable: %v", err)
		if os.Getenv(testutil.PrivilegedEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return k
}

// AgentInit is the test guest's /init (see the package doc).
var AgentInit = strings.NewReplacer("@GUEST@", fmt.Sprintf("%s/%d", netns.GuestAddr, netns.PrefixLen)).Replace(agentInit)

const agentInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
  ip addr add @GUEST@ dev eth0
  ip link set eth0 up
fi
dev=
for p in /sys/class/virtio-ports/*; do
  [ "$(cat $p/name 2>/dev/null)" = agent ] && dev=/dev/${p##*/}
done
echo "agent port: $dev"
( i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 1; done ) &
if [ -z "$dev" ] && [ -x /bin/vsockagent ]; then
  for m in $(cat /lib/modules/vsock-order); do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
  exec /bin/vsockagent
fi
# The port stays open for the guest's whole life, as forkd-agent keeps its
# own: Linux discards what has arrived on a virtio-serial port when the guest
# closes it, so a close-and-reopen loop loses a line that a connecting host
# sends in the instant between the end-of-file and the close.
exec 3<>$dev
while true; do
  while read -r cmd arg <&3; do
    case "$cmd" in
      ping) echo pong >&3 ;;
      set) echo "$arg" > /tmp/state; echo ok >&3 ;;
      get) echo "state=$(cat /tmp/state 2>/dev/null)" >&3 ;;
      run) echo "$(eval "$arg" 2>&1 | tr '\n' ' ')" >&3 ;;
      *) echo "echo: $cmd $arg" >&3 ;;
    esac
  done
  # read returns end-of-file while no host client is connected.
  sleep 0.05
done
`

// Initramfs writes an uncompressed initramfs with the host's static
// busybox, AgentInit and Modules from k to a file in the test's temporary
// directory and returns its path.
func Initramfs(t testing.TB, k *image.Kernel) string {
	t.Helper()
	bb := testutil.RequiresBinary(t, "busybox")
	if err := requireStatic(bb); err != nil {
		t.Skipf("host busybox unusable in a guest: %v", err)
	}
	bbData, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "lib", "lib/modules"} {
		must(w.Dir(d, 0o755))
	}
	must(w.File("bin/busybox", 0o755, bbData))
	must(w.File("init", 0o755, []byte(AgentInit)))
	for _, m := range Modules {
		data, err := os.ReadFile(filepath.Join(k.ModulesDir, m+".ko"))
		if err != nil {
			t.Fatalf("module %s: %v (kernel %s has %v)", m, err, k.Version, k.Modules)
		}
		must(w.File("lib/modules/"+m+".ko", 0o644, data))
	}
	must(w.File("lib/modules/order", 0o644, []byte(strings.Join(Modules, "\n")+"\n")))
	if agent, err := vsockAgent(); err != nil {
		t.Logf("test guest without a vsock agent (only a VM with the virtio-serial port can be tested): %v", err)
	} else {
		must(w.File("bin/vsockagent", 0o755, agent))
		for _, m := range VsockModules {
			data, err := os.ReadFile(filepath.Join(k.ModulesDir, m+".ko"))
			if err != nil {
				t.Fatalf("module %s: %v (kernel %s has %v)", m, err, k.Version, k.Modules)
			}
			must(w.File("lib/modules/"+m+".ko", 0o644, data))
		}
		must(w.File("lib/modules/vsock-order", 0o644, []byte(strings.Join(VsockModules, "\n")+"\n")))
	}
	must(w.Close())
	path := filepath.Join(t.TempDir(), "initrd.cpio")
	must(os.WriteFile(path, buf.Bytes(), 0o644))
	return path
}

var vsockAgentOnce struct {
	sync.Once
	data []byte
	err  error
}

// vsockAgent builds vsockagent, static, once per test process.
func vsockAgent() ([]byte, error) {
	o := &vsockAgentOnce
	o.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "testguest-")
		if err != nil {
			o.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "vsockagent")
		cmd := exec.Command(gobin, "build", "-trimpath", "-o", out, "github.com/forkd-dev/forkd/internal/testutil/testguest/vsockagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			o.err = fmt.Errorf("go build vsockagent: %v: %s", err, b)
			return
		}
		o.data, o.err = os.ReadFile(out)
	})
	return o.data, o.err
}

func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

// Agent is a client of AgentInit's line protocol.
type Agent struct {
	conn net.Conn
	r    *bufio.Reader
}

// NewAgent wraps a connection to the agent port.
func NewAgent(c net.Conn) *Agent { return &Agent{conn: c, r: bufio.NewReader(c)} }

// Call sends one line and returns the reply line, within timeout.
func (a *Agent) Call(line string, timeout time.Duration) (string, error) {
	a.conn.SetDeadline(time.Now().Add(timeout))
	defer a.conn.SetDeadline(time.Time{})
	if _, err := a.conn.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	s, err := a.r.ReadString('\n')
	return strings.TrimRight(s, "\n"), err
}

// ReadLine reads one more reply line, within timeout.
func (a *Agent) ReadLine(timeout time.Duration) (string, error) {
	a.conn.SetDeadline(time.Now().Add(timeout))
	defer a.conn.SetDeadline(time.Time{})
	s, err := a.r.ReadString('\n')
	return strings.TrimRight(s, "\n"), err
}

// Send sends one line without waiting for a reply.
func (a *Agent) Send(line string) error {
	_, err := a.conn.Write([]byte(line + "\n"))
	return err
}

// Close closes the connection.
func (a *Agent) Close() error { return a.conn.Close() }
