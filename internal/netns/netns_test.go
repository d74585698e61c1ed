package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/testutil"
)

func testName(t *testing.T) string {
	return fmt.Sprintf("%stest-%d-%s", NamePrefix, os.Getpid(), strings.ToLower(t.Name()[4:]))
}

func TestCreateRemove(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	name := testName(t)
	setupRan := false
	ns, err := Create(ctx, name, Options{TapUID: 65534, TapGID: 65534, Setup: func(ns *NS) error {
		setupRan = true
		// Setup runs inside: the tap is visible by name.
		_, err := netlink.LinkByName(ns.TapName())
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	if !setupRan {
		t.Error("Setup not run")
	}
	if ns.Path() != "/run/netns/"+name || ns.Name() != name || ns.TapName() != DefaultTap {
		t.Errorf("ns = %s %s %s", ns.Path(), ns.Name(), ns.TapName())
	}
	if !mounted(ns.Path()) {
		t.Fatal("not a namespace mount")
	}

	// The same name again is refused.
	if _, err := Create(ctx, name, Options{}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Create: %v", err)
	}

	// Inside: lo up, tap with HostAddr/30 and TapMAC, no default route.
	err = ns.Do(func() error {
		tap, err := netlink.LinkByName(DefaultTap)
		if err != nil {
			return err
		}
		if tap.Type() != "tuntap" || tap.Attrs().HardwareAddr.String() != TapMAC {
			return fmt.Errorf("tap: type %s mac %s", tap.Type(), tap.Attrs().HardwareAddr)
		}
		tt := tap.(*netlink.Tuntap)
		if tt.Owner != 65534 || tt.Group != 65534 {
			return fmt.Errorf("tap owner %d group %d", tt.Owner, tt.Group)
		}
		addrs, err := netlink.AddrList(tap, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0].IPNet.String() != HostAddr+"/30" {
			return fmt.Errorf("tap addresses %v", addrs)
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if lo.Attrs().Flags&net.FlagUp == 0 {
			return errors.New("lo is down")
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil {
				return fmt.Errorf("default route present: %v", r)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Not in the host's namespace.
	if _, err := netlink.LinkByName(DefaultTap); err == nil {
		t.Error("tap0 visible in the host namespace")
	}

	// Operators can use iproute2 on it.
	if ip, err := exec.LookPath("ip"); err == nil {
		out, err := exec.Command(ip, "-n", name, "-4", "-o", "addr", "show", "dev", DefaultTap).CombinedOutput()
		if err != nil || !strings.Contains(string(out), HostAddr+"/30") {
			t.Errorf("ip -n %s addr: %v: %s", name, err, out)
		}
	}

	names, err := List(NamePrefix)
	if err != nil || !slices.Contains(names, name) {
		t.Errorf("List = %v, %v", names, err)
	}

	if err := ns.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ns.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point left: %v", err)
	}
	if err := ns.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := Open(name, ""); !errdefs.IsNotFound(err) {
		t.Errorf("Open after Remove: %v", err)
	}
}

// TestListenInside checks that a socket made in Do lives in the namespace:
// HostAddr is reachable from inside only.
func TestListenInside(t *testing.T) {
	testutil.RequiresRoot(t)
	ns, err := Create(context.Background(), testName(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", HostAddr+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	err = ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 2)
		_, err = c.Read(b)
		return err
	})
	if err != nil {
		t.Fatalf("dial inside: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("reached the namespace's address from the host")
	}
}

func TestDoRestoresThread(t *testing.T) {
	testutil.RequiresRoot(t)
	ns, err := Create(context.Background(), testName(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	hostLinks := func() int {
		l, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	before := hostLinks()
	wantErr := errors.New("boom")
	for range 20 {
		if err := ns.Do(func() error { return wantErr }); !errors.Is(err, wantErr) {
			t.Fatalf("Do error = %v", err)
		}
	}
	// Every thread still sees the host's links.
	for range 20 {
		if got := hostLinks(); got != before {
			t.Fatalf("host links %d, then %d", before, got)
		}
	}
	if err := DoPath("/run/netns/does-not-exist-forkd", func() error { return nil }); !errdefs.IsNotFound(err) {
		t.Errorf("DoPath missing: %v", err)
	}
}

// TestRemoveTakesDevices: Remove leaves a namespace's devices to the
// kernel, which deletes them when the last holder of the namespace goes:
// here a socket open inside it, then nothing. The uplink's host end shows
// it from outside.
func TestRemoveTakesDevices(t *testing.T) {
	testutil.RequiresRoot(t)
	host, err := Create(context.Background(), testName(t)+"-h", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Remove() })
	ns, err := Create(context.Background(), testName(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	const hostEnd = "fkt-rm0"
	if err := ns.AddUplink(host.Path(), Uplink{HostName: hostEnd,
		HostAddr: netip.MustParsePrefix("10.250.0.1/30"), NSAddr: netip.MustParsePrefix("10.250.0.2/30")}); err != nil {
		t.Fatal(err)
	}
	var holder net.Listener
	if err := ns.Do(func() (err error) { holder, err = net.Listen("tcp", HostAddr+":0"); return }); err != nil {
		t.Fatal(err)
	}
	uplinkLeft := func() bool {
		up, err := HostUplinks(host.Path(), hostEnd)
		if err != nil {
			t.Fatal(err)
		}
		return len(up) == 1
	}
	if err := ns.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ns.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point left: %v", err)
	}
	if !uplinkLeft() {
		t.Fatal("the uplink went while a socket still held the namespace")
	}
	holder.Close()
	// The kernel's namespace cleanup runs in a work queue: wait for it.
	deadline := time.Now().Add(time.Minute)
	for uplinkLeft() {
		if time.Now().After(deadline) {
			t.Fatal("the uplink's host end is still there a minute after its namespace's last holder went")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestInvalidNames(t *testing.T) {
	for _, n := range []string{"", ".", "..", "a/b"} {
		if _, err := Create(context.Background(), n, Options{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Create(%q) = %v", n, err)
		}
	}
	if _, err := Create(context.Background(), "forkd-x", Options{TapName: "a-very-long-tap-name"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("long tap name: %v", err)
	}
}

// TestNoIPv6: sandbox networking is IPv4 only; no device of a namespace,
// nor an uplink's host end, has an IPv6 address, and the namespace refuses
// IPv6 on devices made later.
func TestNoIPv6(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	host, err := Create(context.Background(), testName(t)+"-h", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Remove() })
	// The host's namespace runs IPv6, as a host's usually does.
	if err := host.Do(func() error {
		for _, c := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+c+"/disable_ipv6", []byte("0"), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ns, err := Create(context.Background(), testName(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Remove() })
	const hostEnd = "fkt-v6-0"
	if err := ns.AddUplink(host.Path(), Uplink{HostName: hostEnd,
		HostAddr: netip.MustParsePrefix("10.250.0.5/30"), NSAddr: netip.MustParsePrefix("10.250.0.6/30")}); err != nil {
		t.Fatal(err)
	}
	v6 := func(nsPath, link string) []string {
		h, err := RouteHandle(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		var l netlink.Link
		if link != "" {
			if l, err = h.LinkByName(link); err != nil {
				t.Fatal(err)
			}
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, a := range addrs {
			s = append(s, a.IPNet.String())
		}
		return s
	}
	if a := v6(ns.Path(), ""); len(a) != 0 {
		t.Errorf("IPv6 addresses in the sandbox namespace: %v", a)
	}
	if a := v6(host.Path(), "lo"); len(a) == 0 {
		t.Error("the host namespace has no IPv6 on lo: the test cannot tell")
	}
	if a := v6(host.Path(), hostEnd); len(a) != 0 {
		t.Errorf("IPv6 addresses on the uplink's host end: %v", a)
	}
	if err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/default/disable_ipv6")
		if err == nil && strings.TrimSpace(string(b)) != "1" {
			err = fmt.Errorf("default/disable_ipv6 = %q", b)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
}
