package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
)

// serveInMountNS starts `forkd serve` as systemd starts a unit with
// ProtectSystem=, PrivateTmp= and the like: in a mount namespace of its
// own whose mounts are slaves of this one's, so what it mounts (its
// sandboxes' namespace names) never shows here, nor in the namespace of
// the next daemon. It returns once the daemon answers, with its pid.
func (c *cli) serveInMountNS(t *testing.T) int {
	t.Helper()
	unshare := testutil.RequiresBinary(t, "unshare")
	logf, err := os.OpenFile(filepath.Join(c.runDir, "forkd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(unshare, "--mount", "--propagation", "slave", filepath.Join(repoRoot, "bin", "forkd"), "serve")
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	waitFor(t, 3*time.Minute, "the daemon in its own mount namespace to answer", func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("the daemon exited:\n%s", log)
		default:
		}
		_, _, code := c.run("--no-autostart", "ls")
		return code == 0
	})
	return cmd.Process.Pid
}

// nsInode is the inode of a namespace of process pid ("net", "mnt").
func nsInode(t *testing.T, pid int, kind string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// netnsHolders lists what keeps network namespace ino alive that /proc
// shows: processes that live in it and mounts of it (a name), in any
// mount namespace.
func netnsHolders(ino uint64) []string {
	var out []string
	mark := fmt.Sprintf("net:[%d]", ino)
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if l, _ := os.Readlink(p + "/ns/net"); l == mark {
			out = append(out, "process "+filepath.Base(p))
		}
		mi, _ := os.ReadFile(p + "/mountinfo")
		for _, line := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[3] == mark {
				out = append(out, fmt.Sprintf("mount %s seen by %s", f[4], filepath.Base(p)))
			}
		}
	}
	return out
}

// TestRestartInNewMountNamespace: a daemon in a private mount namespace (as
// under systemd with ProtectSystem=strict) is stopped, and the next one,
// in a new private mount namespace, which never saw the first one's
// namespace names, adopts the sandbox with its network: egress with its
// resolver and allow-list, a forwarded port, and a kill that leaves
// nothing holding the namespace.
func TestRestartInNewMountNamespace(t *testing.T) {
	w := testnet.New(t)
	c := newCLI(t)
	c.env = append(c.env, "FORKD_NETWORK_HOST_NETNS="+w.Host.Path(),
		"FORKD_NETWORK_POOL=10.231.60.0/24", "FORKD_NETWORK_DNS_UPSTREAM="+testnet.Upstream)
	first := c.serveInMountNS(t)
	t.Cleanup(func() {
		// Before newCLI's cleanup, which would autostart a daemon.
		c.run("--no-autostart", "kill", "--all")
		c.run("daemon", "stop")
	})
	if nsInode(t, first, "mnt") == nsInode(t, os.Getpid(), "mnt") {
		t.Fatal("the daemon shares the test's mount namespace")
	}
	tag := "it-mntns-" + snapshot.NewID()
	c.ok("--no-autostart", "snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("--no-autostart", "rmi", tag)
	id := strings.TrimSpace(c.ok("--no-autostart", "fork", "--tag", tag, "-q", "--network", "allow:allowed.example.com,"+testnet.WebB+"/tcp"))
	var sb apiv1.Sandbox
	if err := json.Unmarshal([]byte(c.ok("--no-autostart", "sandbox", "info", id, "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	sbNS := nsInode(t, sb.PID, "net")

	// The systemd situation: the sandbox's namespace name is the first
	// daemon's mount; here (as on the host) there is no namespace by
	// that name.
	name := filepath.Join(netns.MountDir, c.envValue("FORKD_NETNS_PREFIX")+id)
	if isNSMount(name) {
		t.Fatalf("%s is a namespace here: the daemon's mounts propagate, the test reproduces nothing", name)
	}

	wget := func(url string) (string, int) {
		out, _, code := c.run("--no-autostart", "exec", id, "--", "wget", "-q", "-O", "-", url)
		return strings.TrimSpace(out), code
	}
	// A server in the guest, reached through the daemon (which dials it
	// from the sandbox's namespace).
	c.ok("--no-autostart", "exec", id, "--", "sh", "-c",
		"mkdir -p /tmp/www && echo port-ok-"+id+" > /tmp/www/index.html && busybox httpd -p 8765 -h /tmp/www")
	port := func() (int, string) {
		resp, err := unixHTTP(filepath.Join(c.runDir, "forkd.sock")).Get("http://forkd/v1/sandboxes/" + id + "/ports/8765/index.html")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	check := func(when string) {
		t.Helper()
		if out, code := wget("http://allowed.example.com/"); code != 0 || out != "hello from "+testnet.WebA {
			t.Errorf("%s: through the resolver: %q exit %d", when, out, code)
		}
		if out, code := wget("http://" + testnet.WebB + "/"); code != 0 || out != "hello from "+testnet.WebB {
			t.Errorf("%s: an allowed address: %q exit %d", when, out, code)
		}
		if out, code := wget("http://198.51.100.20/"); code == 0 {
			t.Errorf("%s: a port the allow-list does not name: %q", when, out)
		}
		var code int
		var body string
		waitFor(t, time.Minute, when+": the port forward", func() bool {
			code, body = port()
			return code == http.StatusOK
		})
		if body != "port-ok-"+id {
			t.Errorf("%s: port 8765 answered %q", when, body)
		}
	}
	check("first daemon")

	c.ok("daemon", "stop")
	waitGone(t, first)
	if syscall.Kill(sb.PID, 0) != nil {
		t.Fatal("the sandbox's VMM stopped with the daemon")
	}
	second := c.serveInMountNS(t)
	if m := nsInode(t, second, "mnt"); m == nsInode(t, os.Getpid(), "mnt") {
		t.Fatal("the second daemon shares the test's mount namespace")
	}

	var after apiv1.Sandbox
	if err := json.Unmarshal([]byte(c.ok("--no-autostart", "sandbox", "info", id, "--json")), &after); err != nil {
		t.Fatal(err)
	}
	if after.State != apiv1.StateRunning || after.PID != sb.PID {
		t.Fatalf("after the restart the sandbox is %s (pid %d, was %d): %s", after.State, after.PID, sb.PID, after.DeadReason)
	}
	if got := c.ok("--no-autostart", "sandbox", "network", id); !strings.Contains(got, "allow:allowed.example.com") {
		t.Errorf("sandbox network after the restart:\n%s", got)
	}
	check("second daemon")
	// The helper below sees what holds a namespace: here the VMM, and
	// the name the second daemon made (the first one's went with its
	// mount namespace).
	h := netnsHolders(sbNS)
	named := slices.ContainsFunc(h, func(s string) bool { return strings.HasSuffix(s, fmt.Sprintf(" seen by %d", second)) })
	if !slices.Contains(h, fmt.Sprintf("process %d", sb.PID)) || !named {
		t.Errorf("before the kill, the sandbox's namespace is held by %v; want its VMM (%d) and a mount seen by the second daemon (%d)", h, sb.PID, second)
	}

	c.ok("--no-autostart", "kill", id)
	waitGone(t, sb.PID)
	waitFor(t, time.Minute, "nothing to hold the killed sandbox's namespace", func() bool {
		return len(netnsHolders(sbNS)) == 0
	})
	waitFor(t, time.Minute, "the killed sandbox's uplink to go", func() bool {
		up, err := netns.HostUplinks(w.Host.Path(), egress.HostLinkPrefix)
		_, left := up[egress.HostLinkName(id)]
		return err == nil && !left
	})
	if _, err := os.Lstat(name); !os.IsNotExist(err) {
		t.Errorf("the killed sandbox's name %s: %v", name, err)
	}
	t.Logf("sandbox %s (netns %d) adopted across mount namespaces (daemon pids %d, %d)", id, sbNS, first, second)
}

// isNSMount reports whether path is a namespace (a mount of nsfs).
func isNSMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// envValue is the value of key in the CLI's environment (the last one).
func (c *cli) envValue(key string) string {
	v := ""
	for _, kv := range c.env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}
