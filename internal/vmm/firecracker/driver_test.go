package firecracker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/uffd"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// testCtx is a test's outer deadline: generous, since the fake firecracker
// is this test binary, which a busy machine can take seconds to start.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// boot starts a fake-backed machine and kills it at the end of the test.
func boot(t *testing.T, d *Driver, cfg vmm.MachineConfig) *Machine {
	t.Helper()
	m, err := d.Boot(testCtx(t), vmm.BootSpec{MachineConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	return m.(*Machine)
}

// echo checks that a DialAgent connection carries bytes both ways (the
// fake's vsock echoes).
func echo(t *testing.T, m vmm.Machine) {
	t.Helper()
	c, err := m.DialAgent(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping\n" {
		t.Fatalf("echo over vsock: %q, %v", b, err)
	}
}

func TestBootSequence(t *testing.T) {
	d, log := newTestDriver(t, Config{})
	cfg := testConfig(t, "vm0", testImage(t))
	cfg.Network = &vmm.Network{TapName: "tap0", MAC: "06:00:c6:33:64:02"}
	cfg.TrackDirtyPages = true
	cfg.DiskRead = vmm.RateLimit{BytesPerSec: 100 << 20}
	m := boot(t, d, cfg)

	cs := calls(t, log)
	want := []string{"PUT /machine-config 204", "PUT /boot-source 204", "PUT /drives/rootfs 204",
		"PUT /network-interfaces/eth0 204", "PUT /vsock 204", "PUT /entropy 204", "PUT /actions 204"}
	if got := sequence(cs); !slices.Equal(got, want) {
		t.Fatalf("boot sequence:\n got %q\nwant %q", got, want)
	}
	mc := body(t, cs, "PUT", "/machine-config")
	if mc["vcpu_count"] != 2.0 || mc["mem_size_mib"] != 256.0 || mc["track_dirty_pages"] != true {
		t.Errorf("machine-config %v", mc)
	}
	root := body(t, cs, "PUT", "/drives/rootfs")
	if root["is_read_only"] != true || root["is_root_device"] != false || root["path_on_host"] != cfg.Image.Rootfs || root["rate_limiter"] == nil {
		t.Errorf("root drive %v", root)
	}
	if bs := body(t, cs, "PUT", "/boot-source"); !strings.HasSuffix(bs["boot_args"].(string), " quiet") {
		t.Errorf("boot args %v", bs["boot_args"])
	}
	if nic := body(t, cs, "PUT", "/network-interfaces/eth0"); nic["host_dev_name"] != "tap0" || nic["guest_mac"] != cfg.Network.MAC {
		t.Errorf("nic %v", nic)
	}
	echo(t, m)
	if tail := m.ConsoleTail(4096); !strings.Contains(tail, "booted") {
		t.Errorf("console %q", tail)
	}
	if err := m.Stop(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	<-m.Done()
	if err := m.ExitError(); err != nil {
		t.Errorf("a requested stop: %v", err)
	}
	if got := calls(t, log); got[len(got)-1].String() != "PUT /actions 204" || !strings.Contains(string(got[len(got)-1].Body), "SendCtrlAltDel") {
		t.Errorf("stop sent %v", got[len(got)-1])
	}
}

func TestSnapshotAndRestoreFile(t *testing.T) {
	d, log := newTestDriver(t, Config{})
	img := testImage(t)
	cfg := testConfig(t, "tmpl", img)
	cfg.Network = &vmm.Network{TapName: "tap0"}
	cfg.TrackDirtyPages = true
	m := boot(t, d, cfg)
	snap := t.TempDir()
	full, err := m.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: filepath.Join(snap, "state"), MemoryFile: filepath.Join(snap, "mem")})
	if err != nil {
		t.Fatal(err)
	}
	diff, err := m.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(snap, "state.diff"), MemoryFile: filepath.Join(snap, "mem.diff")})
	if err != nil {
		t.Fatal(err)
	}
	cs := calls(t, log)
	var tail []string
	for _, c := range sequence(cs)[7:] {
		tail = append(tail, c)
	}
	want := []string{"PATCH /vm 204", "PUT /snapshot/create 204", "PATCH /vm 204", "PATCH /vm 204", "PUT /snapshot/create 204", "PATCH /vm 204"}
	if !slices.Equal(tail, want) {
		t.Fatalf("snapshots:\n got %q\nwant %q", tail, want)
	}
	if b := body(t, cs, "PUT", "/snapshot/create"); b["snapshot_type"] != "Diff" || b["mem_file_path"] != diff.MemoryFile {
		t.Errorf("diff snapshot %v", b)
	}
	if full.MemoryFile != filepath.Join(snap, "mem") || full.Paused <= 0 {
		t.Errorf("full result %+v", full)
	}

	childCfg := testConfig(t, "child", img)
	childCfg.Network = &vmm.Network{TapName: "tap-child"}
	childCfg.MemoryFile = full.MemoryFile
	child, err := d.Prepare(testCtx(t), vmm.PrepareSpec{MachineConfig: childCfg, StateFile: full.StateFile})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Kill()
	if _, err := child.DialAgent(testCtx(t)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("dial before restore: %v", err)
	}
	if _, err := child.Restore(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// The child's fake logs to the same file, after the template's calls.
	cs = calls(t, log)
	load := body(t, cs, "PUT", "/snapshot/load")
	if mb := load["mem_backend"].(map[string]any); mb["backend_type"] != "File" || mb["backend_path"] != full.MemoryFile {
		t.Errorf("mem_backend %v", mb)
	}
	if ov := load["network_overrides"].([]any)[0].(map[string]any); ov["iface_id"] != "eth0" || ov["host_dev_name"] != "tap-child" {
		t.Errorf("network override %v", ov)
	}
	if vs := load["vsock_override"].(map[string]any); vs["uds_path"] != filepath.Join(childCfg.RunDir, vsockName) {
		t.Errorf("vsock override %v", vs)
	}
	if load["resume_vm"] != true || load["clock_realtime"] != true {
		t.Errorf("load %v", load)
	}
	echo(t, child)
	if err := child.(*Machine).Pause(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := child.(*Machine).Resume(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := sequence(calls(t, log)); !slices.Equal(got[len(got)-3:], []string{"PUT /snapshot/load 204", "PATCH /vm 204", "PATCH /vm 204"}) {
		t.Errorf("child calls end %q", got[len(got)-3:])
	}
}

func TestRestoreUffd(t *testing.T) {
	d, log := newTestDriver(t, Config{})
	img := testImage(t)
	full := fullTemplate(t, d, img)

	// The guest's memory: a few pages of data in the sparse image.
	data := make([]byte, 64<<10)
	rand.Read(data)
	if err := writeAt(full.MemoryFile, data, 3<<20+4096); err != nil {
		t.Fatal(err)
	}
	mem, err := os.ReadFile(full.MemoryFile)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(mem)

	// A real page server serves it: the fake registers its memory with
	// a userfaultfd and reads all of it through the server.
	chain, err := uffd.OpenChain(full.MemoryFile)
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Close()
	sock := filepath.Join(t.TempDir(), "uffd.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sctx, stop := context.WithCancel(testCtx(t))
	served := make(chan error, 1)
	go func() { served <- uffd.NewServer(chain, uffd.Options{}).Serve(sctx, l) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("page server: %v", err)
		}
	}()
	cfg := testConfig(t, "child", img)
	child, err := d.Prepare(testCtx(t), vmm.PrepareSpec{MachineConfig: cfg, StateFile: full.StateFile, MemoryBackend: vmm.MemoryBackendUffd, UffdSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Kill()
	if _, err := child.Restore(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	const said = "fctest: guest memory sha256 "
	var console string
	for deadline := time.Now().Add(3 * time.Minute); !strings.Contains(console, said); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the fake never read its memory through the page server; console:\n%s", console)
		}
		console = child.ConsoleTail(1 << 16)
	}
	got := console[strings.Index(console, said)+len(said):]
	if got, _, _ = strings.Cut(got, "\n"); got != hex.EncodeToString(want[:]) {
		t.Errorf("the guest read memory with digest %s through the page server, the snapshot's is %x", got, want)
	}
	mb := body(t, calls(t, log), "PUT", "/snapshot/load")["mem_backend"].(map[string]any)
	if mb["backend_type"] != "Uffd" || mb["backend_path"] != sock {
		t.Errorf("mem_backend %v", mb)
	}
}

func TestLayerPerChild(t *testing.T) {
	d, log := newTestDriver(t, Config{LayerMiB: 8})
	img := testImage(t)
	m := boot(t, d, testConfig(t, "tmpl", img))
	snap := t.TempDir()
	full, err := m.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: filepath.Join(snap, "state"), MemoryFile: filepath.Join(snap, "mem")})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(full.StateFile + layerSuffix); err != nil || st.Size() != 8<<20 {
		t.Fatalf("the snapshot's layer: %v", err)
	}
	cfg := testConfig(t, "child", img)
	cfg.MemoryFile = full.MemoryFile
	child, err := d.Prepare(testCtx(t), vmm.PrepareSpec{MachineConfig: cfg, StateFile: full.StateFile})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Kill()
	if _, err := child.Restore(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	cs := calls(t, log)
	if got := sequence(cs)[len(cs)-3:]; !slices.Equal(got, []string{"PUT /snapshot/load 204", "PATCH /drives/layer 204", "PATCH /vm 204"}) {
		t.Errorf("restore with a layer: %q", got)
	}
	if p := body(t, cs, "PATCH", "/drives/layer")["path_on_host"]; p != filepath.Join(cfg.RunDir, layerName) {
		t.Errorf("child layer %v", p)
	}
	if body(t, cs, "PUT", "/snapshot/load")["resume_vm"] != false {
		t.Error("the child resumed before its layer was swapped in")
	}
}

func TestDiffNeedsDirtyTracking(t *testing.T) {
	d, log := newTestDriver(t, Config{})
	m := boot(t, d, testConfig(t, "vm", testImage(t)))
	before := len(calls(t, log))
	snap := t.TempDir()
	_, err := m.Snapshot(testCtx(t), vmm.SnapshotSpec{Type: vmm.SnapshotDiff, StateFile: filepath.Join(snap, "s"), MemoryFile: filepath.Join(snap, "m")})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "TrackDirtyPages") {
		t.Errorf("diff without tracking: %v", err)
	}
	if n := len(calls(t, log)); n != before {
		t.Errorf("%d calls: the driver sent a request it knew would fail", n)
	}
}

// TestErrorMapping: a 400 with a fault_message becomes an error that
// quotes it and carries an errdefs class.
func TestErrorMapping(t *testing.T) {
	d, _ := newTestDriver(t, Config{}, "PUT /boot-source=400:Invalid kernel image: not an ELF")
	_, err := d.Boot(testCtx(t), vmm.BootSpec{MachineConfig: testConfig(t, "vm", testImage(t))})
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "PUT /boot-source: 400 Bad Request: Invalid kernel image: not an ELF") {
		t.Fatalf("boot with a bad kernel: %v", err)
	}
	if !strings.HasPrefix(err.Error(), "firecracker boot vm: ") {
		t.Errorf("error does not name the machine: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	d, _ := newTestDriver(t, Config{})
	cfg := testConfig(t, "vm", testImage(t))
	cfg.VCPUs = 3
	if _, err := d.Boot(testCtx(t), vmm.BootSpec{MachineConfig: cfg}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("3 vCPUs: %v", err)
	}
	cfg = testConfig(t, "vm", testImage(t))
	cfg.Accel = vmm.AccelTCG
	if _, err := d.Boot(testCtx(t), vmm.BootSpec{MachineConfig: cfg}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("TCG: %v", err)
	}
	if _, err := d.Prepare(testCtx(t), vmm.PrepareSpec{MachineConfig: testConfig(t, "c", testImage(t)), StateFile: "/s", MemoryBackend: vmm.MemoryBackendUffd}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("uffd without a socket: %v", err)
	}
	if _, err := New(Config{Binary: "/nonexistent/firecracker", NoJailer: true}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "releases") {
		t.Errorf("missing binary: %v", err)
	}
}

func TestVersionAndChecks(t *testing.T) {
	d, _ := newTestDriver(t, Config{})
	if v, err := d.Version(testCtx(t)); err != nil || v != WrittenAgainst {
		t.Errorf("version %q, %v", v, err)
	}
	checks := Checks(testCtx(t), vmm.Options{Binary: d.binary, NoJail: true})
	names := map[string]vmm.Check{}
	for _, c := range checks {
		names[c.Name] = c
		if !c.OK && c.Fix == "" {
			t.Errorf("check %s fails without a fix", c.Name)
		}
	}
	for _, n := range []string{"firecracker binary", "firecracker version", "jailer binary", "kvm"} {
		if _, ok := names[n]; !ok {
			t.Errorf("no %s check", n)
		}
	}
	if !names["firecracker version"].OK || !names["jailer binary"].OK {
		t.Errorf("checks %+v", checks)
	}
	missing := Checks(testCtx(t), vmm.Options{Binary: "/nonexistent/firecracker"})
	if missing[0].OK || !strings.Contains(missing[0].Fix, MinVersion) {
		t.Errorf("missing binary check %+v", missing[0])
	}
	if !versionAtLeast("1.14.0", MinVersion) || versionAtLeast("1.13.9", MinVersion) || !versionAtLeast("1.17.0-dev", MinVersion) {
		t.Error("versionAtLeast")
	}
}

// A kernel that is neither an ELF vmlinux nor a bzImage fails the boot
// before Firecracker is told of it, naming what it wants, and leaves no
// VMM running.
func TestBootKernelNotELF(t *testing.T) {
	d, log := newTestDriver(t, Config{})
	img := testImage(t)
	if err := os.WriteFile(img.Kernel, []byte("not a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := d.Boot(testCtx(t), vmm.BootSpec{MachineConfig: testConfig(t, "vm-badkernel", img)})
	if err == nil {
		m.Kill()
		t.Fatal("booted a kernel that is neither ELF nor bzImage")
	}
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "bzImage") {
		t.Errorf("%v, want invalid argument naming the bzImage it wants", err)
	}
	for _, c := range calls(t, log) {
		if c.Path == "/boot-source" {
			t.Errorf("boot-source was sent: %v", c)
		}
	}
}

// [driver.firecracker] reaches the driver's Config; unknown keys, wrong
// types and a uid without a gid are refused naming them.
func TestDriverConfigSection(t *testing.T) {
	bin, _ := fakeEnv(t)
	drv, err := newFromOptions(vmm.Options{Binary: bin, NoJail: true, Config: map[string]any{
		"chroot_base": "/srv/fc", "uid": int64(4000), "gid": int64(4001), "layer_mib": int64(64), "no_clock_realtime": true,
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := drv.(*Driver).cfg
	if c.ChrootBase != "/srv/fc" || c.UID != 4000 || c.GID != 4001 || c.LayerMiB != 64 || !c.NoClockRealtime {
		t.Fatalf("config %+v", c)
	}
	for name, e := range map[string]struct {
		section map[string]any
		says    string
	}{
		"unknown key":    {map[string]any{"chroot": "/x"}, `"chroot"`},
		"wrong type":     {map[string]any{"layer_mib": "big"}, "layer_mib"},
		"uid without id": {map[string]any{"uid": int64(4000)}, "gid"},
		"negative layer": {map[string]any{"layer_mib": int64(-1)}, "LayerMiB"},
	} {
		_, err := newFromOptions(vmm.Options{Binary: bin, NoJail: true, Config: e.section})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), e.says) {
			t.Errorf("%s: %v, want an invalid argument naming %s", name, err, e.says)
		}
	}
}
