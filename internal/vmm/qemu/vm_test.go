package qemu

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/cgroup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/jail"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil"
	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// The tests in this file boot real microVMs (TCG here: ~2 s a boot) and
// need root for network namespaces and -runas.

const testMemMiB = 256

// Bounds on waits for TCG guests and their QEMU on a busy machine. They
// only stop a hang, so they are generous.
const (
	vmTimeout   = 5 * time.Minute // boot, restore or branch machines
	callTimeout = 2 * time.Minute // one reply: the agent's, QMP's, an exit
)

// fixture is a template booted and snapshotted once for the tests of a
// package run, inside its own network namespace, with a NIC, so that
// every clone can have one.
type fixture struct {
	d        *Driver
	image    vmm.Image
	dir      string
	memFile  string
	state    string
	memHash  string
	tmplNS   *netns.NS
	bootTime time.Duration
	snap     vmm.SnapshotResult
	qmpReady time.Duration
}

var (
	fixtureOnce sync.Once
	fixtureVal  *fixture
	fixtureErr  error
)

// testCgroups is the cgroup parent of this test process's VMMs; the
// drivers made (testDrivers) remove their groups at the end (TestMain).
var (
	testCgroups = cgroup.Config{Parent: fmt.Sprintf("forkd-qemu-test-%d", os.Getpid())}
	testMu      sync.Mutex
	testDrivers []*Driver
)

// removeTestCgroups deletes the groups of every test driver, then the
// test process's parent group.
func removeTestCgroups() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testMu.Lock()
	defer testMu.Unlock()
	for _, d := range testDrivers {
		d.removeCgroups(ctx)
	}
	if len(testDrivers) > 0 {
		if m, err := cgroup.New(testCgroups); err == nil {
			m.Remove(ctx)
		}
	}
}

func newTestDriver(t testing.TB, cfg Config) *Driver {
	t.Helper()
	cfg.KillOnParentDeath = true
	cfg.Jail = os.Geteuid() == 0
	if cfg.Jail && cfg.Cgroups == nil {
		cfg.Cgroups = &testCgroups
	}
	if os.Getenv("FORKD_TEST_DEBUG") == "1" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testMu.Lock()
	testDrivers = append(testDrivers, d)
	testMu.Unlock()
	return d
}

// shortDir is a temporary directory with a short path (unix sockets).
func shortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// template returns the shared fixture, building it on first use.
func template(t *testing.T) *fixture {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, DefaultBinary)
	k := testguest.Kernel(t)
	initrd := testguest.Initramfs(t, k)
	fixtureOnce.Do(func() { fixtureVal, fixtureErr = buildTemplate(t, k.Vmlinuz, initrd) })
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixtureVal
}

func buildTemplate(t *testing.T, kernel, initrd string) (*fixture, error) {
	// The initrd lives in the first caller's TempDir; keep a copy that
	// outlives it.
	dir := shortDir(t, "forkd-qemu-test")
	data, err := os.ReadFile(initrd)
	if err != nil {
		return nil, err
	}
	initrd = filepath.Join(dir, "initrd.cpio")
	if err := os.WriteFile(initrd, data, 0o644); err != nil {
		return nil, err
	}
	f := &fixture{
		d:       newTestDriver(t, Config{RunAs: "nobody"}),
		image:   vmm.Image{Kernel: kernel, Initrd: initrd},
		dir:     dir,
		memFile: filepath.Join(dir, "template.mem"),
		state:   filepath.Join(dir, "template.state"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	f.tmplNS, err = netns.Create(ctx, fmt.Sprintf("forkd-qt-%d-tmpl", os.Getpid()), netns.Options{})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	m, err := f.d.Boot(ctx, vmm.BootSpec{MachineConfig: vmm.MachineConfig{
		ID:         "tmpl",
		RunDir:     filepath.Join(dir, "tmpl"),
		Image:      f.image,
		MemoryMiB:  testMemMiB,
		MemoryFile: f.memFile,
		Network:    &vmm.Network{NetNSPath: f.tmplNS.Path(), TapName: f.tmplNS.TapName(), MAC: netns.GuestMAC},
	}})
	if err != nil {
		return nil, err
	}
	defer m.Kill()
	f.qmpReady = m.(*Machine).StartupTime()
	if err := checkUID(m.PID(), 65534); err != nil {
		return nil, err
	}
	conn, err := m.DialAgent(ctx)
	if err != nil {
		return nil, err
	}
	a := testguest.NewAgent(conn)
	if r, err := a.Call("ping", vmTimeout); err != nil || r != "pong" {
		return nil, fmt.Errorf("template agent: %q, %v; console:\n%s", r, err, m.ConsoleTail(2000))
	}
	f.bootTime = time.Since(start)
	if r, err := a.Call("set template", callTimeout); err != nil || r != "ok" {
		return nil, fmt.Errorf("set: %q, %v", r, err)
	}
	// Warm the guest's neighbour entry for the host side, so clones
	// inherit it (the tap's MAC is the same everywhere).
	if r, err := a.Call("run ping -c1 -W30 "+netns.HostAddr+" >/dev/null && echo reachable", callTimeout); err != nil || !strings.Contains(r, "reachable") {
		return nil, fmt.Errorf("template ping host: %q, %v", r, err)
	}
	a.Close()
	f.snap, err = m.Snapshot(ctx, vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: f.state, StopAfter: true})
	if err != nil {
		return nil, err
	}
	select {
	case <-m.Done():
	default:
		return nil, errors.New("template still running after Snapshot(StopAfter)")
	}
	if err := m.ExitError(); err != nil {
		return nil, fmt.Errorf("template exit after snapshot: %v", err)
	}
	f.memHash, err = fileHash(f.memFile)
	return f, err
}

func TestMain(m *testing.M) {
	jail.Main() // VMMs of test drivers start in jails (newTestDriver)
	code := m.Run()
	removeTestCgroups()
	if f := fixtureVal; f != nil {
		f.tmplNS.Remove()
		os.RemoveAll(f.dir)
	}
	os.Exit(code)
}

func checkUID(pid, want int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(v)
			for _, id := range f {
				if id != fmt.Sprint(want) {
					return fmt.Errorf("qemu uids %v, want all %d", f, want)
				}
			}
			return nil
		}
	}
	return errors.New("no Uid line")
}

func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// clone prepares a clone of the fixture in a network namespace of its own.
func (f *fixture) clone(t *testing.T, d *Driver, id string) (*Machine, *netns.NS) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	cfg := vmm.MachineConfig{
		ID:         id,
		RunDir:     filepath.Join(f.dir, id),
		Image:      f.image,
		MemoryMiB:  testMemMiB,
		MemoryFile: f.memFile,
	}
	// Every clone needs the template's device set, NIC included.
	ns, err := netns.Create(ctx, fmt.Sprintf("forkd-qt-%d-%s", os.Getpid(), id), netns.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	cfg.Network = &vmm.Network{NetNSPath: ns.Path(), TapName: ns.TapName(), MAC: netns.GuestMAC}
	m, err := d.Prepare(ctx, vmm.PrepareSpec{MachineConfig: cfg, StateFile: f.state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(); <-m.Done() })
	return m.(*Machine), ns
}

func TestTemplateSnapshot(t *testing.T) {
	f := template(t)
	st, err := os.Stat(f.state)
	if err != nil {
		t.Fatal(err)
	}
	// Device state only: tens of KB, never the 256 MiB of RAM.
	if st.Size() < 10<<10 || st.Size() > 1<<20 {
		t.Errorf("state file %d bytes", st.Size())
	}
	mt, err := os.Stat(f.memFile)
	if err != nil {
		t.Fatal(err)
	}
	if mt.Size() != testMemMiB<<20 {
		t.Errorf("memory file %d bytes", mt.Size())
	}
	if f.snap.MemoryFile != f.memFile || f.snap.StateFile != f.state || f.snap.Duration <= 0 {
		t.Errorf("snapshot result %+v", f.snap)
	}
	t.Logf("template: QEMU start->QMP %v, boot->agent %v, snapshot %v (paused %v), state %d bytes",
		f.qmpReady, f.bootTime, f.snap.Duration, f.snap.Paused, st.Size())
}

func TestClones(t *testing.T) {
	f := template(t)
	// Each clone drops to a uid of its own from a range of exactly two.
	uids := UIDRange{First: 2_000_100_000, Count: 2}
	d := newTestDriver(t, Config{UIDs: uids})
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()

	ids := []string{"c1", "c2"}
	seenUID := map[int]string{}
	machines := make([]*Machine, len(ids))
	nss := make([]*netns.NS, len(ids))
	agents := make([]*testguest.Agent, len(ids))
	for i, id := range ids {
		start := time.Now()
		machines[i], nss[i] = f.clone(t, d, id)
		t.Logf("%s: Prepare %v (QEMU start->QMP %v)", id, time.Since(start), machines[i].StartupTime())
		uid, err := procUID(machines[i].PID())
		switch {
		case err != nil:
			t.Error(err)
		case !uids.Contains(uid):
			t.Errorf("%s runs as uid %d, outside %+v", id, uid, uids)
		case seenUID[uid] != "":
			t.Errorf("%s runs as uid %d, like %s", id, uid, seenUID[uid])
		}
		seenUID[uid] = id
		// The agent can be dialled before the guest runs.
		conn, err := machines[i].DialAgent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		agents[i] = testguest.NewAgent(conn)
		defer agents[i].Close()
	}
	// Snapshot and a second Restore are refused in the wrong state.
	if _, err := machines[0].Snapshot(ctx, vmm.SnapshotSpec{StateFile: filepath.Join(f.dir, "x")}); !errdefs.IsNotImplemented(err) {
		t.Errorf("snapshot of a clone: %v", err)
	}
	for i, m := range machines {
		tm, err := m.Restore(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: Restore load %v total %v", ids[i], tm.Load, tm.Total)
		if _, err := m.Restore(ctx); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("second Restore: %v", err)
		}
	}
	for i, a := range agents {
		start := time.Now()
		if r, err := a.Call("ping", callTimeout); err != nil || r != "pong" {
			t.Fatalf("%s ping: %q, %v\n%s", ids[i], r, err, machines[i].ConsoleTail(1000))
		}
		t.Logf("%s: first agent answer %v after restore", ids[i], time.Since(start))
		// Each clone starts from the template's memory...
		if r, _ := a.Call("get", callTimeout); r != "state=template" {
			t.Errorf("%s: inherited state %q", ids[i], r)
		}
	}
	// ...and then lives its own life.
	for i, a := range agents {
		if r, err := a.Call("set "+ids[i], callTimeout); err != nil || r != "ok" {
			t.Fatalf("%s set: %q %v", ids[i], r, err)
		}
	}
	for i, a := range agents {
		if r, _ := a.Call("get", callTimeout); r != "state="+ids[i] {
			t.Errorf("%s: state %q after writes", ids[i], r)
		}
	}
	// The guests keep running: new ticks reach each console.
	for i, m := range machines {
		waitFor(t, callTimeout, func() bool { return ticksAfterRestore(m.ConsoleTail(4096)) >= 2 },
			"%s console ticking", ids[i])
	}

	// Networking: each guest is reachable from inside its namespace, as
	// GuestAddr, and reaches HostAddr there.
	for i, ns := range nss {
		if r, err := agents[i].Call("run ping -c1 -W30 "+netns.HostAddr+" >/dev/null && echo reachable", callTimeout); err != nil || !strings.Contains(r, "reachable") {
			t.Errorf("%s: guest -> host side: %q %v", ids[i], r, err)
		}
		if err := reachGuest(ns, agents[i]); err != nil {
			t.Errorf("%s: host side -> guest: %v", ids[i], err)
		}
	}
	// The namespaces are separate although the addresses are the same: a
	// listener in c1's namespace is out of c2's guest's reach.
	if err := separated(nss[0], agents[0], agents[1]); err != nil {
		t.Error(err)
	}
	// The host's namespace has no address of the guests' links (no test
	// traffic goes there: this host may accept any TCP connection).
	if err := hostHasNoTapAddr(); err != nil {
		t.Error(err)
	}

	// A crash of one clone (SIGKILL from outside) leaves the other alone.
	if err := syscall.Kill(machines[0].PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-machines[0].Done():
	case <-time.After(callTimeout):
		t.Fatal("Done not closed after SIGKILL")
	}
	err := machines[0].ExitError()
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "signal: killed") || !strings.Contains(err.Error(), "console tail:") || !strings.Contains(err.Error(), "tick") {
		t.Errorf("ExitError after a crash = %v", err)
	}
	if machines[0].PID() != 0 {
		t.Error("PID not 0 after exit")
	}
	if _, err := os.Stat(filepath.Join(f.dir, "c1", qmpSocket)); !os.IsNotExist(err) {
		t.Errorf("qmp socket left behind: %v", err)
	}
	if r, err := agents[1].Call("ping", callTimeout); err != nil || r != "pong" {
		t.Errorf("c2 after c1 died: %q %v", r, err)
	}

	// A guest panic (panic=-1 resets, -no-reboot exits) is an unexpected
	// exit too, with its reason.
	agents[1].Send("run echo c > /proc/sysrq-trigger")
	select {
	case <-machines[1].Done():
	case <-time.After(callTimeout):
		var regs string
		machines[1].QMP().Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info registers"}, &regs)
		t.Fatalf("guest panic did not end QEMU; console:\n%s\nregs:\n%s", machines[1].ConsoleTail(3000), regs)
	}
	if err := machines[1].ExitError(); err == nil || !strings.Contains(err.Error(), "guest-reset") {
		t.Errorf("ExitError after a guest panic = %v", err)
	}
	// Stop and Kill on exited machines are no-ops.
	if err := machines[1].Stop(ctx); err != nil {
		t.Error(err)
	}
	if err := machines[1].Kill(); err != nil {
		t.Error(err)
	}

	// Stop: QMP quit, a clean exit, no error, no sockets left.
	c3, _ := f.clone(t, d, "c3")
	if _, err := c3.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c3.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c3.ExitError(); err != nil {
		t.Errorf("ExitError after Stop = %v", err)
	}
	for _, name := range []string{qmpSocket, agentSocket, consoleSocket, pidFile} {
		if _, err := os.Stat(filepath.Join(c3.Config().RunDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s left after Stop: %v", name, err)
		}
	}
	if _, err := c3.DialAgent(ctx); !errdefs.IsUnavailable(err) {
		t.Errorf("DialAgent after Stop: %v", err)
	}
	if _, err := c3.Restore(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Restore after Stop: %v", err)
	}

	after, err := fileHash(f.memFile)
	if err != nil {
		t.Fatal(err)
	}
	if after != f.memHash {
		t.Error("clones changed the template's memory file")
	}
}

// reachGuest checks both directions inside ns: the guest's nc connects to
// a listener on HostAddr, and a TCP connection attempt from inside the
// namespace to GuestAddr gets the guest kernel's answer (a reset).
func reachGuest(ns *netns.NS, a *testguest.Agent) error {
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netns.HostAddr+":0")
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(callTimeout))
		s, _ := bufio.NewReader(c).ReadString('\n')
		got <- s
	}()
	cmd := fmt.Sprintf("run echo hello-from-guest | nc -w 30 %s %d", netns.HostAddr, port)
	if _, err := a.Call(cmd, callTimeout); err != nil {
		return err
	}
	select {
	case s := <-got:
		if strings.TrimSpace(s) != "hello-from-guest" {
			return fmt.Errorf("listener got %q", s)
		}
	case <-time.After(callTimeout):
		return errors.New("no connection from the guest")
	}
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", netns.GuestAddr+":1", callTimeout)
		if err == nil {
			c.Close()
			return nil
		}
		// A refused connection (RST) proves the guest answered.
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return fmt.Errorf("dial guest: %w", err)
	})
}

// separated checks that a listener in ns is reachable from guest a (whose
// namespace it is) and not from guest b (same addresses, other namespace).
func separated(ns *netns.NS, a, b *testguest.Agent) error {
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netns.HostAddr+":0")
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("here\n"))
			c.Close()
		}
	}()
	// Refused at once in the other namespace: the timeout only matters
	// for the own namespace's listener, when the machine is slow.
	cmd := fmt.Sprintf("run nc -w 30 %s %d </dev/null || echo failed", netns.HostAddr, ln.Addr().(*net.TCPAddr).Port)
	if r, err := a.Call(cmd, callTimeout); err != nil || !strings.Contains(r, "here") {
		return fmt.Errorf("own namespace's listener: %q %v", r, err)
	}
	if r, err := b.Call(cmd, callTimeout); err != nil || strings.Contains(r, "here") || !strings.Contains(r, "failed") {
		return fmt.Errorf("other namespace's listener: %q %v", r, err)
	}
	return nil
}

func hostHasNoTapAddr() error {
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), netns.HostAddr+"/") {
				return fmt.Errorf("host interface %s has %s", i.Name, a)
			}
		}
	}
	return nil
}

// ticksAfterRestore counts the distinct "tick" lines of a clone's console
// (its own file: everything in it was printed after the restore).
func ticksAfterRestore(console string) int {
	var ticks []string
	for _, l := range strings.Split(console, "\n") {
		if strings.HasPrefix(l, "tick ") {
			ticks = append(ticks, l)
		}
	}
	return len(slices.Compact(ticks))
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+format, args...)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAnonymousMemory covers a VM without a memory file: its snapshot
// carries guest RAM in the state file, the VM continues after it, and a
// clone restores from the state file alone.
func TestAnonymousMemory(t *testing.T) {
	f := template(t) // for the image; this test boots its own VM
	d := newTestDriver(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	dir := shortDir(t, "forkd-qemu-anon")
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := vmm.MachineConfig{ID: "anon", RunDir: filepath.Join(dir, "anon"), Image: f.image, MemoryMiB: 128}
	m, err := d.Boot(ctx, vmm.BootSpec{MachineConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(); <-m.Done() })
	conn, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := testguest.NewAgent(conn)
	defer a.Close()
	if r, err := a.Call("set before", vmTimeout); err != nil || r != "ok" {
		t.Fatalf("set: %q %v\n%s", r, err, m.ConsoleTail(2000))
	}
	state := filepath.Join(dir, "anon.state")
	res, err := m.Snapshot(ctx, vmm.SnapshotSpec{StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	if res.MemoryFile != "" {
		t.Errorf("memory file %q", res.MemoryFile)
	}
	if st, err := os.Stat(state); err != nil || st.Size() < 1<<20 {
		t.Fatalf("state file with RAM: %v %v", st.Size(), err)
	}
	// The VM went on running.
	if r, err := a.Call("set after", callTimeout); err != nil || r != "ok" {
		t.Fatalf("after snapshot: %q %v", r, err)
	}
	cfg.ID, cfg.RunDir = "anon-clone", filepath.Join(dir, "clone")
	c, err := d.Prepare(ctx, vmm.PrepareSpec{MachineConfig: cfg, StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(); <-c.Done() })
	cconn, err := c.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ca := testguest.NewAgent(cconn)
	defer ca.Close()
	tm, err := c.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore with %d MiB of RAM in the state file: %v", cfg.MemoryMiB, tm.Load)
	if r, err := ca.Call("get", callTimeout); err != nil || r != "state=before" {
		t.Errorf("clone state %q %v", r, err)
	}
}
