package apisock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil"
)

// helperEnv makes the test binary a client: it GETs /ping over the socket
// the variable names and exits 0, or 13 on EACCES.
const helperEnv = "FORKD_APISOCK_TEST_DIAL"

func TestMain(m *testing.M) {
	if sock := os.Getenv(helperEnv); sock != "" {
		code, body := dial(sock)
		fmt.Print(body)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func dial(sock string) (int, string) {
	c := http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://forkd/ping")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, syscall.EACCES) {
			return 13, ""
		}
		return 1, ""
	}
	body, _ := io.ReadAll(resp.Body)
	return 0, string(body)
}

// run adds a name with groupadd/useradd and removes it when the test ends.
func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newUser creates a system user without a home, in groups (comma list,
// may be empty), and returns the credential a login would give it: its
// uid, primary gid and supplementary groups from the group database.
func newUser(t *testing.T, name, groups string) *syscall.Credential {
	t.Helper()
	args := []string{"useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"}
	if groups != "" {
		args = append(args, "--groups", groups)
	}
	run(t, append(args, name)...)
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	gids, err := u.GroupIds()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gids {
		n, _ := strconv.Atoi(g)
		cred.Groups = append(cred.Groups, uint32(n))
	}
	return cred
}

// call runs the test binary as cred against sock: its exit code and output.
func call(t *testing.T, bin, sock string, cred *syscall.Credential) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// serve listens with access a on a socket in a fresh run dir and answers
// /ping; the run dir's parent is world-traversable, as /run is.
func serve(t *testing.T, parent string, a Access) string {
	t.Helper()
	runDir, err := os.MkdirTemp(parent, "run-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(runDir, "forkd.sock")
	ln, err := Listen(sock, runDir, a)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pong") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); os.Remove(sock) })
	return sock
}

// TestGroupAccess: a member of the socket's group calls the API, a user
// outside it gets permission denied; without the group only root can.
func TestGroupAccess(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, b := range []string{"groupadd", "groupdel", "useradd", "userdel"} {
		testutil.RequiresBinary(t, b)
	}
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e8, 36)
	group := "fkt-g" + suffix
	run(t, "groupadd", "--system", group)
	t.Cleanup(func() { exec.Command("groupdel", group).Run() })
	member := newUser(t, "fkt-m"+suffix, group)
	outsider := newUser(t, "fkt-o"+suffix, "")

	// The test binary, where the unprivileged users can run it.
	parent, err := os.MkdirTemp("", "apisock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	os.Chmod(parent, 0o755)
	self, _ := os.Executable()
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(parent, "client.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}

	a := Resolve(group)
	if a.GID < 0 || a.Mode != GroupMode || a.RootOnly != "" {
		t.Fatalf("Resolve(%q) = %+v, want the group", group, a)
	}
	sock := serve(t, parent, a)
	for path, want := range map[string]os.FileMode{sock: GroupMode, filepath.Dir(sock): GroupDirMod} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != want || sys.Uid != 0 || int(sys.Gid) != a.GID {
			t.Errorf("%s: mode %04o uid %d gid %d, want %04o root:%s (gid %d)", path, st.Mode().Perm(), sys.Uid, sys.Gid, want, group, a.GID)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(sock), ".forkd.sock.*")); len(leftovers) > 0 {
		t.Errorf("temporary socket names left: %v", leftovers)
	}
	if code, out := call(t, bin, sock, member); code != 0 || out != "pong" {
		t.Errorf("member of %s: exit %d, %q; want pong", group, code, out)
	}
	if code, out := call(t, bin, sock, outsider); code != 13 {
		t.Errorf("user outside %s: exit %d, %q; want permission denied", group, code, out)
	}

	// A group that does not exist: root only, and the member is refused.
	none := Resolve("fkt-none" + suffix)
	if none.GID >= 0 || none.Mode != RootMode || !strings.Contains(none.RootOnly, "does not exist") {
		t.Fatalf("Resolve(missing group) = %+v, want root only with the reason", none)
	}
	sock = serve(t, parent, none)
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != RootMode {
		t.Fatalf("root-only socket: %v, %v", st, err)
	}
	if code, out := call(t, bin, sock, member); code != 13 {
		t.Errorf("member against a root-only socket: exit %d, %q; want permission denied", code, out)
	}
	if code, out := dial(sock); code != 0 || out != "pong" {
		t.Errorf("root against the root-only socket: exit %d, %q", code, out)
	}
}
