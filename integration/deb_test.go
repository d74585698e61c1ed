package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// debHost installs the real .deb on this machine with dpkg. Its state
// directories (/var/lib/forkd, /etc/forkd, /run/forkd) are scratch
// directories bind-mounted over the real ones in a mount namespace of the
// test's own, so the purge at its end cannot touch a forkd installation's
// data on a developer's host; everything else (/usr, the unit, dpkg's
// database, the forkd group) is the host's.
type debHost struct {
	t       *testing.T
	nsFile  string            // the persistent mount namespace
	scratch map[string]string // real dir -> its scratch stand-in
}

var debStateDirs = []string{"/var/lib/forkd", "/etc/forkd", "/run/forkd"}

func newDebHost(t *testing.T) *debHost {
	for _, b := range []string{"dpkg", "dpkg-query", "unshare", "nsenter", "runuser", "useradd", "userdel"} {
		testutil.RequiresBinary(t, b)
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f", "${Status}", "forkd").Output(); err == nil && len(out) > 0 {
		// Not a missing prerequisite: this test installs, removes and
		// purges the package and must not take a real installation.
		t.Skipf("a forkd package is already known to dpkg on this host (%s): the install test replaces and purges it, so it does not run here", out)
	}
	for _, p := range []string{"/usr/bin/forkd", "/usr/lib/forkd", "/lib/systemd/system/forkd.service"} {
		if _, err := os.Lstat(p); err == nil {
			// `make install` or a hand install: the package would
			// overwrite it and its purge delete it.
			t.Skipf("%s exists without a forkd package (make install?): the install test would overwrite and then delete it, so it does not run here", p)
		}
	}
	if exec.Command("getent", "group", "forkd").Run() != nil {
		// The package leaves its group on purge, as Debian does; the test
		// leaves the host as it found it.
		t.Cleanup(func() { exec.Command("groupdel", "forkd").Run() })
	}
	root, err := os.MkdirTemp("/run", "forkd-deb-")
	if err != nil {
		t.Fatal(err)
	}
	h := &debHost{t: t, nsFile: filepath.Join(root, "ns", "mnt"), scratch: map[string]string{}}
	t.Cleanup(func() { os.RemoveAll(root) })
	// A namespace file must live on a private mount (as `ip netns` does it).
	nsDir := filepath.Dir(h.nsFile)
	os.MkdirAll(nsDir, 0o700)
	if err := unix.Mount(nsDir, nsDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(nsDir, unix.MNT_DETACH) })
	if err := unix.Mount("", nsDir, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(h.nsFile, nil, 0o600)
	h.must("unshare", "--mount="+h.nsFile, "--propagation", "private", "true")
	t.Cleanup(func() { unix.Unmount(h.nsFile, unix.MNT_DETACH) })
	for i, d := range debStateDirs {
		src := filepath.Join(root, fmt.Sprint("state", i))
		os.MkdirAll(src, 0o755)
		h.scratch[d] = src
		if _, err := os.Stat(d); os.IsNotExist(err) {
			// A mount point; removed again if still empty.
			os.MkdirAll(d, 0o755)
			t.Cleanup(func() { os.Remove(d) })
		}
		h.in("mount", "--bind", src, d)
	}
	return h
}

// serve starts a daemon (the command line serveArgs) in the namespace and
// waits until it answers cli, the command line of a CLI call to it; stop
// kills its sandboxes, sends SIGTERM and waits for it to exit (once,
// however often it is called).
func (h *debHost) serve(what string, serveArgs []string, cli func(args ...string) []string) (stop func()) {
	t := h.t
	t.Helper()
	serve := h.cmd(serveArgs...)
	var log testutil.SyncBuffer
	serve.Stdout, serve.Stderr = &log, &log
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { serve.Wait(); close(exited) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			h.cmd(cli("kill", "--all")...).Run()
			serve.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				serve.Process.Kill()
				t.Errorf("%s did not stop on SIGTERM; log:\n%s", what, log.String())
			}
		})
	}
	testutil.WaitFor(t, what+" to answer", func() bool {
		select {
		case <-exited:
			t.Fatalf("%s exited; log:\n%s", what, log.String())
		default:
		}
		return h.cmd(cli("daemon", "status")...).Run() == nil
	})
	return stop
}

// cmd is a command in the test's mount namespace.
func (h *debHost) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", append([]string{"--mount=" + h.nsFile, "--"}, args...)...)
	cmd.Dir = "/" // no ./recipes: the installed ones must be found
	cmd.Env = append(os.Environ(), "FORKD_NETWORK=none")
	return cmd
}

// in runs a command in the namespace and fails the test if it fails.
func (h *debHost) in(args ...string) string {
	h.t.Helper()
	out, err := h.cmd(args...).CombinedOutput()
	if err != nil {
		h.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (h *debHost) must(args ...string) string {
	h.t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		h.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (h *debHost) status() string {
	out, _ := exec.Command("dpkg-query", "-W", "-f", "${Status} ${Version}", "forkd").Output()
	return string(out)
}

// buildDeb builds the package at version (make deb, binaries as built).
func buildDeb(t *testing.T, version string) string {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "-o", "build", "deb", "DEB_VERSION="+version)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	deb := filepath.Join(repoRoot, "dist", "forkd_"+version+"_amd64.deb")
	t.Cleanup(func() { os.Remove(deb) })
	return deb
}

// TestDebPackage installs the .deb, runs the installed forkd's doctor, a
// daemon and a fork from it, lets a member of the forkd group use it
// without root (and refuses a non-member), upgrades over it keeping data
// and config, removes it (data stays) and purges it (data goes).
func TestDebPackage(t *testing.T) {
	h := newDebHost(t)
	id := snapshot.NewID()[:6]
	v1, v2 := "0.0.0~it"+id+"a", "0.0.0~it"+id+"b"
	deb1, deb2 := buildDeb(t, v1), buildDeb(t, v2)

	h.in("dpkg", "-i", deb1)
	t.Cleanup(func() {
		if h.status() != "" {
			h.cmd("dpkg", "--purge", "forkd").Run()
		}
	})
	if st := h.status(); st != "install ok installed "+v1 {
		t.Fatalf("after dpkg -i: %q", st)
	}
	if _, err := exec.Command("getent", "group", "forkd").Output(); err != nil {
		t.Fatal("the package did not create the forkd group")
	}
	if p, err := exec.LookPath("systemd-analyze"); err == nil {
		h.in(p, "verify", "/lib/systemd/system/forkd.service")
	}
	for _, f := range []string{"README.md", "ARCHITECTURE.md", "SECURITY.md"} {
		if _, err := os.Stat("/usr/share/doc/forkd/" + f); err != nil {
			t.Errorf("the unit's Documentation= names a file the package lacks: %v", err)
		}
	}

	// The installed binary, no flags or env for its agent or recipes.
	runDir, err := os.MkdirTemp("/run", "forkd-debrun-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	global := []string{"--data-dir", dataDir, "--run-dir", runDir}
	forkd := func(args ...string) []string { return append(append([]string{"/usr/bin/forkd"}, global...), args...) }
	var checks []apiv1.Check
	out, _ := h.cmd(forkd("--json", "doctor")...).Output() // exit 1 when any check fails
	if err := json.Unmarshal(out, &checks); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	found := map[string]apiv1.Check{}
	for _, c := range checks {
		found[c.Name] = c
	}
	if c := found["forkd-agent"]; !c.OK || c.Detail != "/usr/lib/forkd/forkd-agent" {
		t.Errorf("installed doctor's forkd-agent check: %+v", c)
	}
	if c := found["socket access"]; !strings.Contains(c.Detail, "group forkd") {
		t.Errorf("installed doctor's socket check: %+v", c)
	}

	stop := h.serve("the installed daemon", forkd("serve", "--pool", "1", "--netns-prefix", "fkd"+id[:4]+"-"), func(args ...string) []string {
		return forkd(append([]string{"--no-autostart"}, args...)...)
	})
	t.Cleanup(stop)
	tag := "it-deb-" + id
	h.in(forkd("snapshot", "create", "--tag", tag, "--recipe", "minimal")...)
	defer h.cmd(forkd("rmi", tag)...).Run()
	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(h.in(forkd("--json", "fork", "--tag", tag, "-n", "1")...)), &fr); err != nil || len(fr.Sandboxes) != 1 {
		t.Fatalf("fork from the installed daemon: %v %+v", err, fr)
	}
	sb := fr.Sandboxes[0].ID
	if got := h.in(forkd("exec", sb, "--", "echo", "from the package")...); got != "from the package\n" {
		t.Fatalf("exec: %q", got)
	}

	// Group forkd: a member lists sandboxes without root, others cannot.
	member, outsider := "fkdm"+id, "fkdo"+id
	h.must("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--groups", "forkd", member)
	t.Cleanup(func() { exec.Command("userdel", member).Run() })
	h.must("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", outsider)
	t.Cleanup(func() { exec.Command("userdel", outsider).Run() })
	asUser := func(user string) (string, error) {
		var b bytes.Buffer
		cmd := h.cmd(append([]string{"runuser", "-u", user, "--"}, forkd("--no-autostart", "--json", "ls")...)...)
		cmd.Stdout, cmd.Stderr = &b, &b
		err := cmd.Run()
		return b.String(), err
	}
	out2, err := asUser(member)
	if err != nil || !strings.Contains(out2, sb) {
		t.Errorf("member of forkd: forkd ls: %v\n%s", err, out2)
	}
	if out2, err := asUser(outsider); err == nil || !strings.Contains(out2, "permission denied") {
		t.Errorf("user outside forkd: forkd ls: %v\n%s; want permission denied", err, out2)
	}
	stop()

	// Upgrade: the data dir and an edited config stay.
	marker := filepath.Join(h.scratch["/var/lib/forkd"], "it-marker")
	conf := filepath.Join(h.scratch["/etc/forkd"], "forkd.toml")
	os.WriteFile(marker, []byte("data\n"), 0o600)
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("the package's config: %v", err)
	}
	f.WriteString("# edited by the install test\n")
	f.Close()
	h.in("dpkg", "-i", deb2)
	if st := h.status(); st != "install ok installed "+v2 {
		t.Fatalf("after the upgrade: %q", st)
	}
	keeps := func(when string) {
		t.Helper()
		if _, err := os.Stat(marker); err != nil {
			t.Errorf("%s: data dir lost: %v", when, err)
		}
		if data, err := os.ReadFile(conf); err != nil || !strings.Contains(string(data), "edited by the install test") {
			t.Errorf("%s: config not kept: %v", when, err)
		}
	}
	keeps("upgrade")

	// Removal ends the sandboxes a daemon still runs (the upgrade kept
	// them): the daemon on the default socket, which prerm asks.
	defRun := []string{"--data-dir", dataDir, "--run-dir", "/run/forkd"}
	// The repository's build speaks the same API and outlives the removal.
	repoForkd := func(args ...string) []string {
		return append(append([]string{filepath.Join(repoRoot, "bin", "forkd"), "--no-autostart"}, defRun...), args...)
	}
	defer h.serve("the upgraded daemon", append(append([]string{"/usr/bin/forkd"}, defRun...), "serve", "--pool", "0", "--netns-prefix", "fke"+id[:4]+"-"), repoForkd)()
	var fr2 apiv1.ForkResponse
	if err := json.Unmarshal([]byte(h.in(repoForkd("--json", "fork", "--tag", tag, "-n", "1")...)), &fr2); err != nil || len(fr2.Sandboxes) != 1 {
		t.Fatalf("fork before the removal: %v %+v", err, fr2)
	}

	h.in("dpkg", "--remove", "forkd")
	testutil.WaitFor(t, "dpkg -r to stop the sandbox's VMM", func() bool {
		return syscall.Kill(fr2.Sandboxes[0].PID, 0) != nil
	})
	h.in(repoForkd("rmi", tag)...)
	if st := h.status(); !strings.HasPrefix(st, "deinstall ok config-files") {
		t.Fatalf("after dpkg -r: %q", st)
	}
	if _, err := os.Stat("/usr/bin/forkd"); err == nil {
		t.Error("dpkg -r left /usr/bin/forkd")
	}
	keeps("remove")

	h.in("dpkg", "--purge", "forkd")
	if st := h.status(); st != "" && !strings.HasPrefix(st, "unknown ok not-installed") {
		t.Fatalf("after dpkg -P: %q", st)
	}
	for _, d := range []string{"/var/lib/forkd", "/etc/forkd"} {
		if ents, _ := os.ReadDir(h.scratch[d]); len(ents) > 0 {
			t.Errorf("purge left %s: %d entries", d, len(ents))
		}
	}
}
