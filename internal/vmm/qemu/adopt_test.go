package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/testutil"
	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// adoptHelperEnv carries an adoptRequest to TestAdoptHelper, which then
// plays a daemon that starts VMs and is killed with SIGKILL.
const adoptHelperEnv = "FORKD_TEST_ADOPT_HELPER"

// adoptRequest tells the helper which VMs to start.
type adoptRequest struct {
	Image vmm.Image
	Dir   string
	IDs   []string
	Pause []string // VMs to leave paused (a daemon killed mid-snapshot)
}

// adoptLine starts the helper's output line carrying the []vmm.AdoptSpec.
const adoptLine = "ADOPT-SPECS "

// TestAdoptHelper is the helper process of TestAdopt, not a test of its
// own: it boots the requested VMs with a daemon's driver configuration (no
// parent-death signal), sets each guest's state to its ID, keeps QMP and
// agent connections open, prints what a daemon would have recorded and
// waits to be killed.
func TestAdoptHelper(t *testing.T) {
	arg := os.Getenv(adoptHelperEnv)
	if arg == "" {
		t.Skip("helper process of TestAdopt")
	}
	var req adoptRequest
	if err := json.Unmarshal([]byte(arg), &req); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{RunAs: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	specs := make([]vmm.AdoptSpec, len(req.IDs))
	errs := make([]error, len(req.IDs))
	var wg sync.WaitGroup
	for i, id := range req.IDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			specs[i], errs[i] = bootForAdoption(ctx, d, req, id)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(adoptLine + string(b))
	time.Sleep(3 * time.Minute) // killed long before
	t.Fatal("the helper was not killed")
}

func bootForAdoption(ctx context.Context, d *Driver, req adoptRequest, id string) (vmm.AdoptSpec, error) {
	m, err := d.Boot(ctx, vmm.BootSpec{MachineConfig: vmm.MachineConfig{
		ID: id, RunDir: filepath.Join(req.Dir, id), Image: req.Image, MemoryMiB: 128,
	}})
	if err != nil {
		return vmm.AdoptSpec{}, err
	}
	conn, err := m.DialAgent(ctx)
	if err != nil {
		return vmm.AdoptSpec{}, err
	}
	// Left open: the connection dies with this process, as a daemon's does.
	a := testguest.NewAgent(conn)
	if r, err := a.Call("set "+id, 90*time.Second); err != nil || r != "ok" {
		return vmm.AdoptSpec{}, fmt.Errorf("%s: set: %q %v\n%s", id, r, err, m.ConsoleTail(2000))
	}
	for _, p := range req.Pause {
		if p == id {
			if err := m.(*Machine).QMP().Execute(ctx, "stop", nil, nil); err != nil {
				return vmm.AdoptSpec{}, err
			}
		}
	}
	return vmm.AdoptSpec{MachineConfig: m.Config(), Process: m.(vmm.Identifiable).ProcessIdentity()}, nil
}

// orphanVMs runs TestAdoptHelper, reads the VMs it started and kills it
// with SIGKILL, leaving its VMs orphaned. The VMs are killed at the end of
// the test if they still run.
func orphanVMs(t *testing.T, req adoptRequest) (specs []vmm.AdoptSpec, helperPID int) {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAdoptHelper$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), adoptHelperEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := make(chan string)
	var seen strings.Builder
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			if l, ok := strings.CutPrefix(s.Text(), adoptLine); ok {
				lines <- l
				break
			}
			seen.WriteString(s.Text() + "\n")
		}
		io.Copy(io.Discard, out)
	}()
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			cmd.Wait()
			t.Fatalf("helper ended without starting its VMs:\n%s%s", seen.String(), stderr.String())
		}
		line = l
	case <-time.After(4 * time.Minute):
		t.Fatal("helper timed out")
	}
	if err := json.Unmarshal([]byte(line), &specs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range specs {
			if p, _, err := openAdoptee(context.Background(), s.MachineConfig, s.Process); err == nil {
				p.kill()
				p.f.Close()
			}
		}
	})
	// SIGKILL: no deferred function of the "daemon" runs.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	return specs, cmd.Process.Pid
}

// TestAdopt starts VMs from a helper process that is then killed with
// SIGKILL, as a daemon can be, and adopts them with a fresh driver.
func TestAdopt(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, DefaultBinary)
	k := testguest.Kernel(t)
	initrd := testguest.Initramfs(t, k)
	dir := shortDir(t, "forkd-adopt")
	t.Cleanup(func() { os.RemoveAll(dir) })

	specs, helper := orphanVMs(t, adoptRequest{
		Image: vmm.Image{Kernel: k.Vmlinuz, Initrd: initrd},
		Dir:   dir,
		IDs:   []string{"a1", "a2"},
		Pause: []string{"a2"},
	})
	a1, a2 := specs[0], specs[1]
	for _, s := range specs {
		if err := survivedParent(s, helper); err != nil {
			t.Fatalf("%s: %v", s.ID, err)
		}
	}

	d := newTestDriver(t, Config{RunAs: "nobody"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("refusals", func(t *testing.T) {
		wrongStart := a1
		wrongStart.Process.StartTime++
		otherVM := a1
		otherVM.ID, otherVM.RunDir = a2.ID, a2.RunDir // a live QEMU, but a2's
		for name, s := range map[string]vmm.AdoptSpec{"wrong start time": wrongStart, "another VM's config": otherVM} {
			if _, err := d.Adopt(ctx, s); !errdefs.IsNotFound(err) {
				t.Errorf("%s: Adopt = %v, want NotFound", name, err)
			} else {
				t.Logf("%s: %v", name, err)
			}
		}
		// Refusing leaves the process alone.
		if err := survivedParent(a1, helper); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("adopt and kill", func(t *testing.T) {
		start := time.Now()
		vm, err := d.Adopt(ctx, a1)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		m := vm.(*Machine)
		t.Logf("adopted pid %d in %v", a1.Process.PID, took)
		if m.PID() != a1.Process.PID || m.ProcessIdentity() != a1.Process {
			t.Errorf("PID %d, identity %+v; want %+v", m.PID(), m.ProcessIdentity(), a1.Process)
		}
		var st struct{ Status string }
		if err := m.QMP().Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
			t.Errorf("query-status: %+v %v", st, err)
		}
		conn, err := m.DialAgent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a := testguest.NewAgent(conn)
		defer a.Close()
		start = time.Now()
		if r, err := a.Call("get", 20*time.Second); err != nil || r != "state=a1" {
			t.Fatalf("get: %q %v\n%s", r, err, m.ConsoleTail(1000))
		}
		t.Logf("first agent answer %v after adopting", time.Since(start))
		if r, err := a.Call("hello adopter", 10*time.Second); err != nil || r != "echo: hello adopter" {
			t.Errorf("echo: %q %v", r, err)
		}
		// The adopter follows the console again: ticks the guest prints
		// from now on reach it.
		seen := lastTick(m.ConsoleTail(4096))
		waitFor(t, callTimeout, func() bool { return lastTick(m.ConsoleTail(4096)) > seen },
			"a tick after %d in the adopted VM's console", seen)
		if _, err := m.Restore(ctx); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Restore of an adopted running VM: %v", err)
		}
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-m.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done not closed after Kill")
		}
		if err := m.ExitError(); err != nil {
			t.Errorf("ExitError after Kill = %v", err)
		}
		if m.PID() != 0 {
			t.Errorf("PID %d after exit", m.PID())
		}
		for _, name := range []string{qmpSocket, agentSocket, consoleSocket, pidFile} {
			if _, err := os.Stat(filepath.Join(a1.RunDir, name)); !os.IsNotExist(err) {
				t.Errorf("%s left after Kill: %v", name, err)
			}
		}
		if err := m.Kill(); err != nil {
			t.Errorf("second Kill: %v", err)
		}
		// The process is gone: adopting it again finds nothing.
		if _, err := d.Adopt(ctx, a1); !errdefs.IsNotFound(err) {
			t.Errorf("Adopt of an exited VMM = %v, want NotFound", err)
		}
	})

	t.Run("paused, resumed, killed from outside", func(t *testing.T) {
		vm, err := d.Adopt(ctx, a2)
		if err != nil {
			t.Fatal(err)
		}
		m := vm.(*Machine)
		var st struct{ Status string }
		if err := m.QMP().Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
			t.Errorf("query-status after adopting a paused VM: %+v %v", st, err)
		}
		conn, err := m.DialAgent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a := testguest.NewAgent(conn)
		defer a.Close()
		if r, err := a.Call("get", 20*time.Second); err != nil || r != "state=a2" {
			t.Fatalf("get: %q %v\n%s", r, err, m.ConsoleTail(1000))
		}
		// The console reaches the adopter: a tick printed since, before
		// the kill, so that the exit error can quote it.
		seen := lastTick(m.ConsoleTail(4096))
		waitFor(t, callTimeout, func() bool { return lastTick(m.ConsoleTail(4096)) > seen },
			"no console output reached the adopter of a paused VM")
		if err := syscall.Kill(a2.Process.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-m.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done not closed after an external SIGKILL")
		}
		err = m.ExitError()
		if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "adopted") ||
			!strings.Contains(err.Error(), "console tail:") || !strings.Contains(err.Error(), "tick") {
			t.Errorf("ExitError = %v", err)
		}
		t.Logf("ExitError: %.300s", err)
		if _, err := m.DialAgent(ctx); !errdefs.IsUnavailable(err) {
			t.Errorf("DialAgent after exit: %v", err)
		}
	})
}

// lastTick is the number of the last "tick N" line of a console, -1 if
// none.
func lastTick(console string) int {
	last := -1
	for _, l := range strings.Split(console, "\n") {
		if v, ok := strings.CutPrefix(l, "tick "); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				last = n
			}
		}
	}
	return last
}

// survivedParent checks that an orphaned VM still runs, on its own: a
// child of someone else than the killed helper, stdin /dev/null, and
// ignoring SIGPIPE, so that writes to its stdout and stderr, a pipe whose
// reader (the helper) is gone, do not kill it.
func survivedParent(s vmm.AdoptSpec, helper int) error {
	pid := s.Process.PID
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return err
	}
	if st.StartTime != s.Process.StartTime || st.State == 'Z' {
		return fmt.Errorf("pid %d: start %d state %c, want a running %d", pid, st.StartTime, st.State, s.Process.StartTime)
	}
	want := map[int]string{0: os.DevNull, 1: "pipe:", 2: "pipe:"}
	for fd, prefix := range want {
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
		if err != nil || !strings.HasPrefix(got, prefix) {
			return fmt.Errorf("pid %d fd %d is %q (%v), want %s", pid, fd, got, err, prefix)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil || mask&(1<<(syscall.SIGPIPE-1)) == 0 {
				return fmt.Errorf("pid %d does not ignore SIGPIPE (SigIgn %s)", pid, strings.TrimSpace(v))
			}
		}
		if v, ok := strings.CutPrefix(l, "PPid:"); ok && strings.TrimSpace(v) == strconv.Itoa(helper) {
			return fmt.Errorf("pid %d is still the child of the killed helper %d", pid, helper)
		}
	}
	return nil
}

// TestAdoptRefusesOtherProcesses covers the identity checks without a VM:
// a live process that is not this machine's QEMU, a wrong start time, an
// exited process and a zombie are all NotFound.
func TestAdoptRefusesOtherProcesses(t *testing.T) {
	testutil.RequiresBinary(t, DefaultBinary)
	d := newTestDriver(t, Config{})
	ctx := context.Background()
	cfg := vmm.MachineConfig{ID: "x", RunDir: filepath.Join(t.TempDir(), "x")}

	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Process.Kill()
	st, err := procfs.ReadStat(sleep.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	id := vmm.ProcessIdentity{PID: sleep.Process.Pid, StartTime: st.StartTime}
	check := func(name string, spec vmm.AdoptSpec, want string) {
		t.Helper()
		_, err := d.Adopt(ctx, spec)
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Adopt = %v, want NotFound saying %q", name, err, want)
		}
	}
	check("not a QEMU", vmm.AdoptSpec{MachineConfig: cfg, Process: id}, "not the QEMU of this machine")
	wrong := id
	wrong.StartTime++
	check("wrong start time", vmm.AdoptSpec{MachineConfig: cfg, Process: wrong}, "another process")
	// Refusing does not harm the process.
	if err := sleep.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("process harmed by a refused Adopt: %v", err)
	}
	sleep.Process.Kill()
	sleep.Wait()
	check("exited", vmm.AdoptSpec{MachineConfig: cfg, Process: id}, "no such process")

	// A zombie (exited, not yet reaped) still holds its PID.
	z := exec.Command("true")
	if err := z.Start(); err != nil {
		t.Fatal(err)
	}
	defer z.Wait()
	var zst procfs.Stat
	for deadline := time.Now().Add(time.Minute); ; {
		if zst, err = procfs.ReadStat(z.Process.Pid); err != nil || zst.State == 'Z' || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if zst.State != 'Z' {
		t.Fatalf("no zombie: %+v %v", zst, err)
	}
	check("zombie", vmm.AdoptSpec{MachineConfig: cfg, Process: vmm.ProcessIdentity{PID: z.Process.Pid, StartTime: zst.StartTime}}, "exited")

	if _, err := d.Adopt(ctx, vmm.AdoptSpec{MachineConfig: cfg}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Adopt without a process: %v", err)
	}
}

func TestIsVMMOf(t *testing.T) {
	cfg := vmm.MachineConfig{ID: "sb-1", RunDir: "/run/forkd/vms/sb,1", MemoryMiB: 128, Image: vmm.Image{Kernel: "/k"}}
	l := &launch{cfg: cfg, accel: vmm.AccelTCG, cpu: "max", runAs: "nobody"}
	args := append([]string{"/usr/bin/qemu-system-x86_64"}, l.args()...)
	if !isVMMOf(args, cfg) {
		t.Errorf("own command line not recognised: %q", args)
	}
	other := cfg
	other.RunDir = "/run/forkd/vms/sb-2"
	if isVMMOf(args, other) {
		t.Error("another run directory accepted")
	}
	other = cfg
	other.ID = "sb-2"
	if isVMMOf(args, other) {
		t.Error("another ID accepted")
	}
}

func TestWaitStatusString(t *testing.T) {
	if got := waitStatusString(syscall.WaitStatus(9)); got != "signal: killed" {
		t.Errorf("wait status 9: %q", got)
	}
	if got := waitStatusString(syscall.WaitStatus(1 << 8)); got != "exit status 1" {
		t.Errorf("wait status 256: %q", got)
	}
}

// fakeVMM starts a process whose command line passes Adopt's identity
// checks for cfg (a shell, waiting) and returns its identity and its exit,
// from the one Wait on it. It returns once the process's command line is
// readable (right after Start it can still read empty).
func fakeVMM(t *testing.T, cfg vmm.MachineConfig) (*exec.Cmd, vmm.ProcessIdentity, *fakeExit) {
	t.Helper()
	sh := testutil.RequiresBinary(t, "sh")
	// The shell waits on its stdin (a pipe left open): no child of its own
	// to outlive it.
	cmd := exec.Command(sh, "-c", "read x", "fake-qemu", "-name", "forkd-"+cfg.ID,
		"-qmp", "unix:"+filepath.Join(cfg.RunDir, qmpSocket)+",server=on,wait=off")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close() })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exit := &fakeExit{done: make(chan struct{})}
	go func() { exit.err = cmd.Wait(); close(exit.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exit.done
	})
	st, err := procfs.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if args, err := procfs.WaitCmdline(context.Background(), cmd.Process.Pid); err != nil || !slices.Contains(args, "fake-qemu") {
		t.Fatalf("fake VMM's command line = %q, %v", args, err)
	}
	return cmd, vmm.ProcessIdentity{PID: cmd.Process.Pid, StartTime: st.StartTime}, exit
}

// fakeExit is a fake VMM's end: done closes when it was reaped, err is
// what Wait returned.
type fakeExit struct {
	done chan struct{}
	err  error
}

// fakeQMP serves QMP on path: a greeting (unless mute) and, for every
// command, an empty return, or {"status": status} for query-status.
func fakeQMP(t *testing.T, path, status string, mute bool) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if mute {
					io.Copy(io.Discard, c)
					return
				}
				enc := json.NewEncoder(c)
				enc.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{"qemu": map[string]int{"major": 7}}, "capabilities": []string{}}})
				dec := json.NewDecoder(c)
				for {
					var cmd struct {
						Execute string `json:"execute"`
						ID      any    `json:"id"`
					}
					if dec.Decode(&cmd) != nil {
						return
					}
					var ret any = map[string]any{}
					if cmd.Execute == "query-status" {
						ret = map[string]any{"status": status, "running": false}
					}
					enc.Encode(map[string]any{"return": ret, "id": cmd.ID})
				}
			}()
		}
	}()
}

// TestAdoptUndrivable: a process that is the recorded VMM but is not
// running a guest is killed; one whose QMP has not answered when the
// caller gives up is left alone.
func TestAdoptUndrivable(t *testing.T) {
	testutil.RequiresBinary(t, DefaultBinary)
	d := newTestDriver(t, Config{})
	dir := shortDir(t, "forkd-adopt-fake")
	t.Cleanup(func() { os.RemoveAll(dir) })

	cfg := vmm.MachineConfig{ID: "prepared", RunDir: filepath.Join(dir, "p")}
	os.MkdirAll(cfg.RunDir, 0o700)
	fakeQMP(t, filepath.Join(cfg.RunDir, qmpSocket), "inmigrate", false)
	_, id, exit := fakeVMM(t, cfg)
	_, err := d.Adopt(context.Background(), vmm.AdoptSpec{MachineConfig: cfg, Process: id})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), `"inmigrate"`) || !strings.Contains(err.Error(), "killed it") {
		t.Errorf("Adopt of a VMM waiting for a restore = %v", err)
	}
	t.Log(err)
	select {
	case <-exit.done:
		if !strings.Contains(fmt.Sprint(exit.err), "killed") {
			t.Errorf("process ended with %v, want killed", exit.err)
		}
	case <-time.After(time.Minute):
		t.Error("the undrivable process was not killed")
	}

	cfg = vmm.MachineConfig{ID: "mute", RunDir: filepath.Join(dir, "m")}
	os.MkdirAll(cfg.RunDir, 0o700)
	fakeQMP(t, filepath.Join(cfg.RunDir, qmpSocket), "", true)
	cmd, id, _ := fakeVMM(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = d.Adopt(ctx, vmm.AdoptSpec{MachineConfig: cfg, Process: id})
	if err == nil || errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "left it running") {
		t.Errorf("Adopt abandoned by its caller = %v", err)
	}
	t.Log(err)
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("process harmed by an abandoned Adopt: %v", err)
	}
}
