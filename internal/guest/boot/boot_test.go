package boot

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	c := ParseCmdline("console=ttyS0 quiet forkd.ip=172.31.0.2/30 forkd.gw=172.31.0.1 forkd.hostname=\"my box\" panic=-1\n")
	if c["forkd.ip"] != "172.31.0.2/30" || c["forkd.gw"] != "172.31.0.1" || c["forkd.hostname"] != "my box" || c["panic"] != "-1" {
		t.Fatalf("%v", c)
	}
	if _, ok := c["quiet"]; !ok {
		t.Fatal("bare word lost")
	}
	if c.Get("forkd.dns", "none") != "none" || c.Get(ParamHostname, "forkd") != "my box" {
		t.Fatal("Get")
	}
}

func TestParseModuleList(t *testing.T) {
	got, err := ParseModuleList(strings.NewReader("virtio_ring.ko\n\n# comment\n  virtio.ko  \nvirtio_mmio.ko"))
	if err != nil || !slices.Equal(got, []string{"virtio_ring.ko", "virtio.ko", "virtio_mmio.ko"}) {
		t.Fatalf("%v %v", got, err)
	}
}

func TestFindPortByName(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	for port, name := range map[string]string{"vport0p0": "other", "vport0p1": "agent"} {
		d := filepath.Join(sys, "class/virtio-ports", port)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "name"), []byte(name+"\n"), 0o644)
	}
	// The node appears a little after the sysfs entry, as with devtmpfs.
	go func() {
		time.Sleep(20 * time.Millisecond)
		os.WriteFile(filepath.Join(dev, "vport0p1"), nil, 0o600)
	}()
	p, vsock, err := findAgentChannel(sys, dev, "agent", time.Minute) // bounds a hang only
	if err != nil || vsock || p != filepath.Join(dev, "vport0p1") {
		t.Fatalf("findAgentChannel = %q, vsock %v, %v", p, vsock, err)
	}
	if _, _, err := findAgentChannel(sys, dev, "missing", 20*time.Millisecond); err == nil {
		t.Fatal("found a port that does not exist")
	}
}

// A VM with a virtio vsock device bound to its driver and no agent port
// (Firecracker) serves on vsock; one with both keeps its port.
func TestFindAgentChannelVsock(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(sys, "bus/virtio/drivers/vmw_vsock_virtio_transport/virtio2"), 0o755)
	p, vsock, err := findAgentChannel(sys, dev, "agent", time.Minute)
	if err != nil || !vsock || p != "" {
		t.Fatalf("findAgentChannel = %q, vsock %v, %v; want vsock", p, vsock, err)
	}
	d := filepath.Join(sys, "class/virtio-ports/vport0p1")
	os.MkdirAll(d, 0o755)
	os.WriteFile(filepath.Join(d, "name"), []byte("agent\n"), 0o644)
	os.WriteFile(filepath.Join(dev, "vport0p1"), nil, 0o600)
	if p, vsock, err := findAgentChannel(sys, dev, "agent", time.Minute); err != nil || vsock || p != filepath.Join(dev, "vport0p1") {
		t.Fatalf("with both: %q, vsock %v, %v; want the port", p, vsock, err)
	}
}

func TestHasVirtioBlock(t *testing.T) {
	sys := t.TempDir()
	add := func(dev, id string) {
		d := filepath.Join(sys, "bus/virtio/devices", dev)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "device"), []byte(id+"\n"), 0o644)
	}
	add("virtio0", "0x0003") // console
	if hasVirtioBlock(sys) {
		t.Fatal("console taken for a disk")
	}
	add("virtio1", "0x0002")
	if !hasVirtioBlock(sys) {
		t.Fatal("disk not seen")
	}
}

func TestLoadModulesReportsFailures(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "forkd-modules")
	os.WriteFile(list, []byte("missing.ko\n"), 0o644)
	var logs []string
	n, total := loadModules(list, dir, func(f string, a ...any) { logs = append(logs, f) })
	if n != 0 || total != 1 || len(logs) != 1 {
		t.Fatalf("loaded %d/%d, logs %v", n, total, logs)
	}
	if n, total := loadModules(filepath.Join(dir, "nope"), dir, func(string, ...any) {}); n != 0 || total != 0 {
		t.Fatal("missing list")
	}
}
