package jail

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	Main()
	if os.Getenv(uffdProbeEnv) != "" {
		os.Exit(uffdProbe())
	}
	os.Exit(m.Run())
}

// uffdProbeEnv makes the test binary open /dev/userfaultfd as uid
// nobody and ask it for a userfaultfd, printing what happened.
const uffdProbeEnv = "FORKD_JAIL_TEST_UFFD"

const nobody = 65534

func uffdProbe() int {
	if err := unix.Setresgid(nobody, nobody, nobody); err != nil {
		fmt.Println("setresgid:", err)
		return 1
	}
	if err := unix.Setresuid(nobody, nobody, nobody); err != nil {
		fmt.Println("setresuid:", err)
		return 1
	}
	fd, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Println("open:", err)
		return 0
	}
	const userfaultfdIOCNew = 0xAA00 // _IO(0xAA, 0x00)
	ufd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), userfaultfdIOCNew, unix.O_CLOEXEC)
	if errno != 0 {
		fmt.Println("USERFAULTFD_IOC_NEW:", errno)
		return 0
	}
	unix.Close(int(ufd))
	fmt.Println("userfaultfd: ok")
	return 0
}

// jailed runs a shell script in a jail built from spec and returns its
// output.
func jailed(t *testing.T, spec Spec, script string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	if err := Wrap(cmd, spec, self); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a jail needs root (mount and PID namespaces)")
	}
}

// TestJail starts a shell in a jail and checks from inside what it sees
// and may do.
func TestJail(t *testing.T) {
	needRoot(t)
	host := t.TempDir()
	for _, d := range []string{"ro", "rw", "hidden"} {
		if err := os.Mkdir(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, d, "f"), []byte(d+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(host, "jailroot")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Root: root,
		Binds: []Bind{
			{Path: "/usr", Exec: true},
			{Path: filepath.Join(host, "ro")},
			{Path: filepath.Join(host, "rw"), Writable: true},
			{Path: filepath.Join(host, "ro", "f")}, // inside ro: visible through it
		},
		Devices:  []string{"/dev/null"},
		Dir:      filepath.Join(host, "rw"),
		RLimits:  []RLimit{{Resource: unix.RLIMIT_NOFILE, Cur: 77, Max: 77}, {Resource: unix.RLIMIT_CORE}},
		KeepCaps: []int{unix.CAP_SETUID, unix.CAP_SETGID},
		Hostname: "forkd-vmm",
		TmpBytes: 1 << 20,
	}
	script := strings.Join([]string{
		`echo "root: $(ls / | tr '\n' ' ')"`,
		`echo "cwd: $(pwd)"`,
		`echo "ro: $(cat ` + host + `/ro/f)"`,
		`echo x > ` + host + `/ro/g 2>/dev/null && echo "ro write: yes" || echo "ro write: no"`,
		`echo x > ` + host + `/rw/g && echo "rw write: yes"`,
		`test -e ` + host + `/hidden/f && echo "hidden: seen" || echo "hidden: absent"`,
		`set -- /proc/[0-9]*; echo "pids: $#"`,
		`echo "pid: $$"`,
		`echo "host: $(cat /proc/sys/kernel/hostname)"`,
		`echo "nofile: $(ulimit -n)"`,
		`grep -E '^(NoNewPrivs|CapBnd|CapEff):' /proc/self/status`,
		`echo > /dev/null && echo "devnull: ok"`,
		`touch /newfile 2>/dev/null && echo "root write: yes" || echo "root write: no"`,
		`touch /tmp/t && echo "tmp write: yes"`,
	}, "; ")
	out, err := jailed(t, spec, script)
	if err != nil {
		t.Fatalf("jailed shell: %v\n%s", err, out)
	}
	t.Logf("inside the jail:\n%s", out)
	// CapBnd: bit 6 (setgid) and 7 (setuid) only.
	for _, want := range []string{
		"cwd: " + host + "/rw\n",
		"ro: ro\n",
		"ro write: no\n",
		"rw write: yes\n",
		"hidden: absent\n",
		"pids: 1\n", // the shell alone (a glob, no child process)
		"pid: 1\n",
		"host: forkd-vmm\n",
		"nofile: 77\n",
		"NoNewPrivs:\t1\n",
		"CapBnd:\t00000000000000c0\n",
		"devnull: ok\n",
		"root write: no\n",
		"tmp write: yes\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	for _, top := range []string{"home", "etc", "root ", "var", "srv"} {
		if strings.Contains(strings.SplitN(out, "\n", 2)[0], " "+top) {
			t.Errorf("the jail's root shows %s: %s", top, strings.SplitN(out, "\n", 2)[0])
		}
	}
	if b, err := os.ReadFile(filepath.Join(host, "rw", "g")); err != nil || string(b) != "x\n" {
		t.Errorf("a write to the writable bind did not reach the host: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(host, "ro", "g")); err == nil {
		t.Error("a write to the read-only bind reached the host")
	}
	// Nothing of the jail is mounted on the host.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), root) {
		t.Errorf("the jail's root is mounted on the host: %v", err)
	}
}

// TestJailFailures refuses a writable path inside a
// read-only bind, and reports a missing path: the jailed command never
// runs.
func TestJailFailures(t *testing.T) {
	needRoot(t)
	host := t.TempDir()
	root := filepath.Join(host, "jailroot")
	os.Mkdir(root, 0o755)
	os.Mkdir(filepath.Join(host, "d"), 0o755)
	for name, c := range map[string]struct {
		binds []Bind
		want  string
	}{
		"writable inside read-only": {[]Bind{{Path: "/usr", Exec: true}, {Path: host}, {Path: filepath.Join(host, "d"), Writable: true}}, "needs more access"},
		"missing":                   {[]Bind{{Path: "/usr", Exec: true}, {Path: filepath.Join(host, "nope")}}, "no such file"},
	} {
		out, err := jailed(t, Spec{Root: root, Binds: c.binds}, "echo ran")
		if err == nil || strings.Contains(out, "ran") || !strings.Contains(out, "forkd-jail: ") || !strings.Contains(out, c.want) {
			t.Errorf("%s: %v %q, want a forkd-jail error with %q", name, err, out, c.want)
		}
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 126 {
			t.Errorf("%s: exit %v, want 126", name, err)
		}
	}
}

// TestOwnedDevice gives a jailed process its own /dev/userfaultfd node:
// uid nobody gets a userfaultfd inside the jail, and not from the host's
// node (root's, mode 0600), whatever vm.unprivileged_userfaultfd says.
func TestOwnedDevice(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat("/dev/userfaultfd"); err != nil {
		t.Skip("no /dev/userfaultfd (Linux 6.1+):", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	probe := func(spec *Spec) string {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), uffdProbeEnv+"=1")
		if spec != nil {
			if err := Wrap(cmd, *spec, self); err != nil {
				t.Fatal(err)
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("probe: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out := probe(nil); !strings.Contains(out, "open: permission denied") {
		t.Fatalf("outside the jail, nobody: %q; want the host node refused", out)
	}
	root := t.TempDir()
	spec := Spec{
		Root: root,
		Binds: []Bind{
			{Path: "/usr", Exec: true},
			{Path: filepath.Dir(self), Exec: true},
		},
		OwnedDevices: []OwnedDevice{{Path: "/dev/userfaultfd", UID: nobody, GID: nobody}},
		Devices:      []string{"/dev/null"},
		Dir:          "/",
		KeepCaps:     []int{unix.CAP_SETUID, unix.CAP_SETGID},
	}
	if out := probe(&spec); out != "userfaultfd: ok" {
		t.Fatalf("inside the jail, nobody: %q; want a userfaultfd", out)
	}
	var st unix.Stat_t
	if err := unix.Stat("/dev/userfaultfd", &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o600 {
		t.Errorf("the host's node changed: uid %d mode %o, %v", st.Uid, st.Mode&0o777, err)
	}
	bad := spec
	bad.OwnedDevices = []OwnedDevice{{Path: "/dev/net/tun", UID: nobody}}
	cmd := exec.Command(self)
	if err := Wrap(cmd, bad, self); err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "only nodes directly under /dev") {
		t.Errorf("a nested owned device: %v %s", err, out)
	}
}
