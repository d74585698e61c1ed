package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
)

// TestInVM boots the agent as PID 1 in a QEMU microVM and drives it through
// a virtio-serial port. Opt-in, as it needs a guest kernel and a root disk:
//
//	FORKD_AGENT_VM_KERNEL_DIR  a directory with vmlinuz, kernel.json (its
//	                           "modules" list gives the load order) and
//	                           modules/*.ko, as the image package caches it
//	FORKD_AGENT_VM_ROOTFS      a busybox ext4 root image (opened read-only)
//	FORKD_AGENT_VM_ACCEL       kvm or tcg (default tcg)
func TestInVM(t *testing.T) {
	kdir, rootfs := os.Getenv("FORKD_AGENT_VM_KERNEL_DIR"), os.Getenv("FORKD_AGENT_VM_ROOTFS")
	if kdir == "" || rootfs == "" {
		t.Skip("set FORKD_AGENT_VM_KERNEL_DIR and FORKD_AGENT_VM_ROOTFS to boot the agent in a VM")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "forkd-agent")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -X main.version=vm-test", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	initrd := filepath.Join(dir, "initrd.img")
	writeTestInitramfs(t, initrd, bin, kdir)

	accel := os.Getenv("FORKD_AGENT_VM_ACCEL")
	if accel == "" {
		accel = "tcg"
	}
	// reboot=t as the QEMU driver has it (kernelArgs in internal/vmm/qemu):
	// other reboot methods can leave a microvm guest looping, never exiting.
	cmdline := "console=ttyS0 panic=-1 reboot=t forkd.hostname=vm-boot forkd.ip=10.0.2.15/24 forkd.gw=10.0.2.2 forkd.dns=10.0.2.3"
	cpu := "host"
	if accel == "tcg" {
		cpu = "max"
		cmdline += " tsc=reliable no_timer_check tsc_early_khz=" + hostKHz(t)
	}
	sock := filepath.Join(dir, "agent.sock")
	console := filepath.Join(dir, "console.log")
	qcmd := exec.Command(qemu,
		"-M", "microvm,x-option-roms=on,isa-serial=on,rtc=on", "-accel", accel, "-cpu", cpu,
		"-smp", "1", "-m", "256M", "-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-no-reboot",
		"-kernel", filepath.Join(kdir, "vmlinuz"), "-initrd", initrd, "-append", cmdline,
		"-serial", "file:"+console,
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path="+sock+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=agent",
		"-drive", "file="+rootfs+",format=raw,if=none,id=d0,readonly=on",
		"-device", "virtio-blk-device,drive=d0",
		// User-mode networking only to give the guest an eth0 to configure;
		// the test sends no traffic.
		"-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-device,netdev=n0",
	)
	var qerr bytes.Buffer
	qcmd.Stdout, qcmd.Stderr = &qerr, &qerr
	if err := qcmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- qcmd.Wait() }()
	defer func() {
		qcmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(console)
			t.Logf("console:\n%s\nqemu: %s", b, qerr.String())
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	connect := func(id string) (*agentconn.Session, *agentclient.Client, agentapi.Ready) {
		t.Helper()
		var conn net.Conn
		for conn == nil {
			c, err := net.Dial("unix", sock)
			if err == nil {
				conn = c
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("agent socket: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		hctx, hcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer hcancel()
		s, ready, err := agentconn.Dial(hctx, conn, agentapi.Hello{Identity: agentapi.Identity{
			SandboxID: id, Hostname: id, UnixNano: time.Now().UnixNano(), Entropy: bytes.Repeat([]byte(id), 32),
		}})
		if err != nil {
			t.Fatalf("Dial %s: %v", id, err)
		}
		return s, agentclient.New(s), ready
	}
	sh := func(c *agentclient.Client, script string) string {
		t.Helper()
		var out, errb bytes.Buffer
		ev, err := c.Exec(ctx, agentapi.ExecRequest{Shell: script, TimeoutMillis: 60000}, nil, &out, &errb)
		if err != nil || ev.ExitCode != 0 {
			t.Fatalf("%q: %+v %v\nstderr: %s", script, ev, err, errb.String())
		}
		return out.String()
	}

	t0 := time.Now()
	s1, c1, ready := connect("vm-one")
	t.Logf("READY after %v: %+v", time.Since(t0), ready.Info)
	if ready.Info.Hostname != "vm-one" || !strings.Contains(ready.Info.Kernel, "cloud-amd64") {
		t.Errorf("READY info: %+v", ready.Info)
	}
	if got := sh(c1, "hostname"); got != "vm-one\n" {
		t.Errorf("hostname %q", got)
	}
	mounts := sh(c1, "cat /proc/mounts")
	for _, want := range []string{"overlay / overlay", "lowerdir=/mnt/lower", "devpts /dev/pts", "tmpfs /tmp", "tmpfs /run", "proc /proc", "sysfs /sys"} {
		if !strings.Contains(mounts, want) {
			t.Errorf("mounts lack %q:\n%s", want, mounts)
		}
	}
	if got := sh(c1, "ip -4 addr show eth0 | grep -o 'inet [0-9./]*'; ip route | grep default; cat /etc/resolv.conf"); got != "inet 10.0.2.15/24\ndefault via 10.0.2.2 dev eth0 \nnameserver 10.0.2.3\n" {
		t.Errorf("network: %q", got)
	}
	guestNow, _ := strconv.ParseInt(strings.TrimSpace(sh(c1, "date +%s")), 10, 64)
	if d := time.Now().Unix() - guestNow; d < -5 || d > 30 {
		t.Errorf("guest clock off by %ds", d)
	}
	if _, err := c1.WriteFile(ctx, "/tmp/x", 0o600, strings.NewReader("hello vm")); err != nil {
		t.Error(err)
	}
	if got := sh(c1, "cat /tmp/x; ls -l /tmp/x | cut -c1-10"); got != "hello vm-rw-------\n" {
		t.Errorf("file: %q", got)
	}
	// Throughput of the virtio-serial transport, both ways.
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	start := time.Now()
	if _, err := c1.WriteFile(ctx, "/tmp/big", 0o644, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	up := time.Since(start)
	start = time.Now()
	var back bytes.Buffer
	if _, err := c1.ReadFile(ctx, "/tmp/big", &back); err != nil || !bytes.Equal(back.Bytes(), big) {
		t.Fatalf("read back %d bytes: %v", back.Len(), err)
	}
	t.Logf("32 MiB up in %v (%.0f MiB/s), down in %v (%.0f MiB/s)", up, 32/up.Seconds(), time.Since(start), 32/time.Since(start).Seconds())
	sh(c1, "rm /tmp/big")

	start = time.Now()
	ev, err := c1.Exec(ctx, agentapi.ExecRequest{Shell: "sleep 100 & sleep 100", TimeoutMillis: 500}, nil, nil, nil)
	if err != nil || !ev.TimedOut || time.Since(start) > time.Minute { // sleep 100 would take longer
		t.Errorf("timeout: %+v %v after %v", ev, err, time.Since(start))
	}
	// Orphans are reaped by the agent as PID 1: no zombies remain. The
	// orphan is gone from /proc (a zombie is still there) once reaped.
	orphan := strings.TrimSpace(sh(c1, "sh -c 'sleep 0.2 & echo $!'"))
	if z := sh(c1, "i=0; while [ -e /proc/"+orphan+" ] && [ $i -lt 500 ]; do sleep 0.1; i=$((i+1)); done; "+
		"[ -e /proc/"+orphan+" ] && echo 'orphan not reaped:'; cat /proc/[0-9]*/stat 2>/dev/null | grep -c ') Z ' || true"); strings.TrimSpace(z) != "0" {
		t.Errorf("orphan %s: %s zombies", orphan, z)
	}

	// Quiesce, then a new host attaches with a new identity.
	if err := c1.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	s1.Close()
	s2, c2, ready := connect("vm-two")
	if ready.Info.SandboxID != "vm-two" || sh(c2, "hostname") != "vm-two\n" {
		t.Errorf("after quiesce: %+v", ready.Info)
	}
	// The host vanishes without quiescing; the next one still attaches.
	s2.Close()
	_, c3, ready := connect("vm-three")
	if ready.Info.SandboxID != "vm-three" {
		t.Errorf("after host loss: %+v", ready.Info)
	}
	info, _ := c3.Info(ctx)
	t.Logf("identity applied in %dµs", info.IdentityApplyMicros)

	if err := c3.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		exited <- nil
	case <-time.After(2 * time.Minute):
		t.Error("the VM did not power off")
	}
	b, _ := os.ReadFile(console)
	t.Logf("console:\n%s", b)
}

func hostKHz(t *testing.T) string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return strconv.Itoa(int(mhz * 1000))
		}
	}
	t.Fatal("no cpu MHz in /proc/cpuinfo")
	return ""
}

// writeTestInitramfs writes the initramfs layout boot expects (see package
// boot) as a newc cpio archive.
func writeTestInitramfs(t *testing.T, path, agent, kdir string) {
	t.Helper()
	var meta struct {
		Modules []string `json:"modules"`
	}
	b, err := os.ReadFile(filepath.Join(kdir, "kernel.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	var w cpioWriter
	for _, d := range []string{"dev", "proc", "sys", "mnt", "tmp", "run", "etc", "lib", "lib/modules"} {
		w.add(d, 0o040755, 0, nil)
	}
	w.add("dev/console", 0o020600, 5<<8|1, nil)
	agentBytes, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	w.add("init", 0o100755, 0, agentBytes)
	for _, m := range meta.Modules {
		mb, err := os.ReadFile(filepath.Join(kdir, "modules", m))
		if err != nil {
			t.Fatal(err)
		}
		w.add("lib/modules/"+m, 0o100644, 0, mb)
	}
	w.add("etc/forkd-modules", 0o100644, 0, []byte(strings.Join(meta.Modules, "\n")+"\n"))
	w.add("TRAILER!!!", 0, 0, nil)
	if err := os.WriteFile(path, w.buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// cpioWriter writes the "newc" format the kernel unpacks.
type cpioWriter struct {
	buf bytes.Buffer
	ino int
}

func (w *cpioWriter) add(name string, mode uint32, rdev int, data []byte) {
	w.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	fmt.Fprintf(&w.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev>>8, rdev&0xff, len(name)+1, 0)
	w.buf.WriteString(name)
	w.buf.WriteByte(0)
	w.pad()
	w.buf.Write(data)
	w.pad()
}

func (w *cpioWriter) pad() {
	for w.buf.Len()%4 != 0 {
		w.buf.WriteByte(0)
	}
}
