package integration

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
)

// guestSh runs script as root in a guest with sh -c, killed (its whole
// process group) after limit.
func guestSh(t *testing.T, a *agentclient.Client, limit time.Duration, script string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit+time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	ev, err := a.Exec(ctx, agentapi.ExecRequest{Shell: script, TimeoutMillis: limit.Milliseconds()}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", tail(script, 200), err)
	}
	return out.String(), errb.String(), ev.ExitCode
}

// witness listens on addr inside the namespace at nsPath and counts the
// connections it accepts (closing each at once).
func witness(t *testing.T, nsPath, addr string) *atomic.Int32 {
	t.Helper()
	var ln net.Listener
	if err := netns.DoPath(nsPath, func() (err error) { ln, err = net.Listen("tcp4", addr); return }); err != nil {
		t.Fatalf("witness on %s in %s: %v", addr, nsPath, err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return &n
}

// uplinkNSAddr is the address of the namespace's side of a sandbox's
// uplink, read from the namespace.
func uplinkNSAddr(t *testing.T, nsPath string) netip.Addr {
	t.Helper()
	h, err := netns.RouteHandle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(netns.UplinkName)
	if err != nil {
		t.Fatalf("%s in %s: %v", netns.UplinkName, nsPath, err)
	}
	addrs, err := h.AddrList(l, unix.AF_INET)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("addresses of %s in %s: %v %v", netns.UplinkName, nsPath, addrs, err)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	return a
}

// scanTarget is an address and the TCP ports probed on it.
type scanTarget struct {
	addr  string
	ports []int
	why   string
}

// scanScript probes every target's ports from the guest, 32 connects at a
// time, each given 5 s, with one fork a probe: busybox nc runs
// /tmp/open on a connection (which closes it), which notes the target it
// was given in T. It prints "OPEN ADDR:PORT" for each port that answered
// and "PROBED N" at the end.
func scanScript(targets []scanTarget) string {
	var b strings.Builder
	b.WriteString(`rm -f /tmp/scan.open
printf '#!/bin/sh\necho "OPEN $T" >> /tmp/scan.open\n' > /tmp/open && chmod +x /tmp/open || exit 1
n=0; total=0
scan() { ip=$1; shift; for p in "$@"; do T=$ip:$p nc -w 5 $ip $p -e /tmp/open </dev/null >/dev/null 2>&1 & n=$((n+1)); total=$((total+1)); [ $n -lt 32 ] || { wait; n=0; }; done; }
`)
	for _, tg := range targets {
		ps := make([]string, len(tg.ports))
		for i, p := range tg.ports {
			ps[i] = strconv.Itoa(p)
		}
		fmt.Fprintf(&b, "scan %s %s\n", tg.addr, strings.Join(ps, " "))
	}
	b.WriteString("wait\ncat /tmp/scan.open 2>/dev/null\necho PROBED $total\n")
	return b.String()
}

// TestHostileNetworkScan: a root guest under `public` scans the host, its
// own gateway, the metadata address, the private trap and its siblings'
// uplinks, then floods the internet with connections under a cap. The
// scan reaches only what `public` allows (the internet's servers, and
// the namespace's resolver); no listener the test put in the host or a
// sibling's namespace, nor the victim guest's own, sees a connection; the
// refusals are counted; the policy still lets the attacker out; the
// sibling and the victim keep working; the engine answers with its
// memory within a bound. Under max_connections more connections than
// the cap are refused while the sibling keeps working.
func TestHostileNetworkScan(t *testing.T) {
	w := testnet.New(t)
	e := netEngine(t, w, "10.231.40.0/24", 0)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()

	sbs, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 3, Network: policy(t, "public")})
	if err != nil {
		t.Fatal(err)
	}
	attacker, sibling, victim := sbs[0], sbs[1], sbs[2]
	for _, sb := range sbs {
		// No pool: each child was linked on the fork's path, and the
		// phase that measures it (forkd bench spawn sums it) says so.
		if ph := sb.Phases; ph.NetworkMillis <= 0 || ph.NetworkMillis > sb.ReadyMillis {
			t.Errorf("sandbox %s: network phase %.2f ms of %.2f ms ready: want a part of it", sb.ID, ph.NetworkMillis, sb.ReadyMillis)
		}
	}
	a, s, v := agentOf(t, e, attacker.ID), agentOf(t, e, sibling.ID), agentOf(t, e, victim.ID)
	nsPath := func(sb *sandbox.Sandbox) string {
		t.Helper()
		name := sb.Info().NetNS
		if name == "" {
			t.Fatalf("sandbox %s has no network namespace", sb.ID)
		}
		p := filepath.Join(netns.MountDir, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	uplinks, err := netns.HostUplinks(w.Host.Path(), egress.HostLinkPrefix)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd := func(sb *sandbox.Sandbox) string {
		t.Helper()
		addr := uplinks[egress.HostLinkName(sb.ID)]
		if !addr.IsValid() {
			t.Fatalf("no uplink for %s in the host namespace: %v", sb.ID, uplinks)
		}
		return addr.String()
	}
	attHost, attNS := hostEnd(attacker), uplinkNSAddr(t, nsPath(attacker)).String()
	vicHost, vicNS := hostEnd(victim), uplinkNSAddr(t, nsPath(victim)).String()
	sibHost, sibNS := hostEnd(sibling), uplinkNSAddr(t, nsPath(sibling)).String()

	// The victim's guest serves TCP on victimPort and counts the
	// connections it gets in /tmp/hits.
	const victimPort = 7777
	if out, errOut, code := guestSh(t, v, time.Minute, fmt.Sprintf(`printf '#!/bin/sh\necho hit >> /tmp/hits\n' > /tmp/hit && chmod +x /tmp/hit &&
setsid nc -ll -p %d -e /tmp/hit </dev/null >/dev/null 2>&1 &
echo started`, victimPort)); code != 0 {
		t.Fatalf("victim listener: exit %d %q %q", code, out, errOut)
	}
	victimHits := func() int {
		t.Helper()
		out, _, _ := guestSh(t, v, time.Minute, "cat /tmp/hits 2>/dev/null | wc -l")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("victim's hits: %q", out)
		}
		return n
	}
	// Up, from inside the victim and through the engine's own path to a
	// guest port (from the victim's namespace): two connections counted.
	victimUp := func(when string, hitsBefore int) int {
		t.Helper()
		waitFor(t, 2*time.Minute, "the victim's listener to answer inside its guest "+when, func() bool {
			_, _, code := guestSh(t, v, time.Minute, fmt.Sprintf("nc -w 2 127.0.0.1 %d -e /bin/true </dev/null", victimPort))
			return code == 0
		})
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		c, err := e.DialPort(dctx, victim.ID, victimPort)
		if err != nil {
			t.Fatalf("%s: the victim's port %d through the engine: %v", when, victimPort, err)
		}
		c.Close()
		// At least those two (the wait may have taken more tries).
		var hits int
		waitFor(t, time.Minute, "the victim's listener to count the checks "+when, func() bool {
			hits = victimHits()
			return hits >= hitsBefore+2
		})
		return hits
	}
	hits0 := victimUp("before the scan", 0)

	// Listeners in every namespace the attacker must not reach: the
	// host's (all its addresses, the uplinks' host ends among them), the
	// victim's and the sibling's (their uplinks' namespace ends), its own
	// (only its resolver is the guest's to reach there), and the trap
	// addresses behind the host.
	witnessPorts := []int{22, 80, 443, 2375, victimPort, 8080}
	witnesses := map[string]*atomic.Int32{}
	for _, ns := range []struct{ name, path string }{
		{"host", w.Host.Path()}, {"victim's namespace", nsPath(victim)}, {"sibling's namespace", nsPath(sibling)},
		{"attacker's own namespace", nsPath(attacker)},
	} {
		for _, p := range witnessPorts {
			witnesses[fmt.Sprintf("%s 0.0.0.0:%d", ns.name, p)] = witness(t, ns.path, fmt.Sprintf("0.0.0.0:%d", p))
		}
	}
	for _, addr := range []string{"169.254.169.254", "10.99.0.1"} {
		for _, p := range []int{22, 443, 8080} {
			witnesses[fmt.Sprintf("internet %s:%d", addr, p)] = witness(t, w.Inet.Path(), fmt.Sprintf("%s:%d", addr, p))
		}
	}

	// The gateway, as the guest sees it.
	routes, _, code := guestSh(t, a, time.Minute, "ip route")
	var gw string
	for _, l := range strings.Split(routes, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "default" && f[1] == "via" {
			gw = f[2]
		}
	}
	if code != 0 || gw != netns.HostAddr {
		t.Fatalf("the attacker's routes (exit %d):\n%s\nwant a default route via %s", code, routes, netns.HostAddr)
	}

	// Every port below 1025 and the test's own services' on the two kinds
	// of address a rule could leave open whatever the port: the
	// namespace's own (the gateway: the guest reaches the namespace
	// itself, and nothing but the resolver may listen there) and the
	// host's. Elsewhere, what a refusal by address must also cover: the
	// usual services' ports. A busybox probe costs a fork, about 10 ms
	// of an emulated vCPU: this keeps the scan to some 2,400.
	// Port 53 only on the gateway: every DNS query is redirected to the
	// namespace's resolver, whatever address it is sent to.
	extra := []int{2375, 2376, 3000, 3306, 5000, 5432, 6379, 6443, victimPort, 8000, 8080, 8443, 9000, 9090, 9100, 9998, 9999, 10250, 11211, 27017}
	var full []int
	for p := 1; p <= 1024; p++ {
		if p != 53 {
			full = append(full, p)
		}
	}
	full = append(full, extra...)
	common := append([]int{21, 22, 23, 25, 80, 110, 111, 135, 139, 143, 443, 445, 873, 993, 995}, extra...)
	targets := []scanTarget{
		{gw, append([]int{53}, full...), "the gateway (the attacker's tap, in its namespace)"},
		{testnet.HostAddr, full, "the host's address"},
		{attHost, common, "the attacker's uplink, host end"},
		{attNS, common, "the attacker's uplink, namespace end"},
		{"169.254.169.254", common, "the metadata address"},
		{vicHost, common, "the victim's uplink, host end"},
		{vicNS, common, "the victim's uplink, namespace end"},
		{sibHost, common, "the sibling's uplink, host end"},
		{sibNS, common, "the sibling's uplink, namespace end"},
		{"10.99.0.1", common, "the private trap"},
		{netns.GuestAddr, []int{victimPort}, "the guest address (the attacker's own)"},
		// What public allows: the scan must find these, or it proves nothing.
		{"198.51.100.10", []int{80}, "the internet (WebA)"},
		{"198.51.100.20", []int{8080}, "the internet (WebB)"},
	}
	want := []string{gw + ":53", testnet.WebA, testnet.WebB}
	probes, blocked := 0, 0
	for _, tg := range targets {
		probes += len(tg.ports)
		if ip := netip.MustParseAddr(tg.addr); slices.ContainsFunc(egress.Reserved, func(p netip.Prefix) bool { return p.Contains(ip) }) &&
			tg.addr != gw && tg.addr != attNS && tg.addr != netns.GuestAddr {
			blocked += len(tg.ports) // refused by the attacker's forward chain, each counted
		}
	}

	deniedBefore := attacker.NetworkInfo(true).Stats
	if deniedBefore == nil {
		t.Fatal("no network stats for the attacker")
	}
	uplinksBefore := uplinks
	rss0 := vmRSS(t, os.Getpid())
	healthy := func(after string) {
		t.Helper()
		if out := run(t, s, "echo", "sibling ok"); out != "sibling ok" {
			t.Fatalf("after %s: sibling answered %q", after, out)
		}
		mustFetch(t, s, testnet.WebA, testnet.WebA)
		mustFetch(t, s, "api.example.org:8080", testnet.WebB) // through its resolver
		if got := len(e.List()); got != 3 {
			t.Errorf("after %s: the engine lists %d sandboxes, want 3", after, got)
		}
		if rss := vmRSS(t, os.Getpid()); rss > rss0+96<<20 {
			t.Errorf("after %s: the engine's process RSS is %d MiB, %d MiB before the attacks", after, rss>>20, rss0>>20)
		}
	}

	start := time.Now()
	out, errOut, code := guestSh(t, a, 10*time.Minute, scanScript(targets))
	t.Logf("scan: %d probes in %v (exit %d)", probes, time.Since(start).Round(time.Millisecond), code)
	if !strings.Contains(out, fmt.Sprintf("PROBED %d\n", probes)) {
		t.Fatalf("the scan did not finish (exit %d): %q %q", code, tail(out, 500), tail(errOut, 500))
	}
	var open []string
	for _, l := range strings.Split(out, "\n") {
		if hit, ok := strings.CutPrefix(l, "OPEN "); ok {
			open = append(open, hit)
		}
	}
	slices.Sort(open)
	for _, hit := range open {
		if !slices.Contains(want, hit) {
			host, _, _ := strings.Cut(hit, ":")
			why := ""
			for _, tg := range targets {
				if tg.addr == host {
					why = tg.why
				}
			}
			t.Errorf("the attacker connected to %s (%s)", hit, why)
		}
	}
	for _, hit := range want {
		if !slices.Contains(open, hit) {
			t.Errorf("the scan did not reach %s, which public allows: it cannot be trusted (open: %v)", hit, open)
		}
	}
	for name, n := range witnesses {
		if got := n.Load(); got != 0 {
			t.Errorf("%d connections reached the test's listener on %s", got, name)
		}
	}
	if hits := victimHits(); hits != hits0 {
		t.Errorf("the victim's listener counted %d connections during the scan", hits-hits0)
	}
	after := attacker.NetworkInfo(true)
	if after.Stats != nil {
		t.Logf("the attacker's denied packets: %d more over %d probes to blocked ranges", after.Stats.DeniedPackets-deniedBefore.DeniedPackets, blocked)
	}
	if after.Stats == nil || after.Stats.DeniedPackets < deniedBefore.DeniedPackets+uint64(blocked) {
		t.Errorf("the attacker's denied packets went from %d to %+v over %d probes to blocked ranges", deniedBefore.DeniedPackets, after.Stats, blocked)
	}
	if after.Policy.Mode != "public" {
		t.Errorf("the attacker's policy after the scan: %+v", after.Policy)
	}
	if up, err := netns.HostUplinks(w.Host.Path(), egress.HostLinkPrefix); err != nil || !maps.Equal(up, uplinksBefore) {
		t.Errorf("uplinks in the host namespace after the scan: %v (%v), before: %v", up, err, uplinksBefore)
	}
	mustFetch(t, a, testnet.WebA, testnet.WebA)
	mustNotFetch(t, a, testnet.HostSvc)
	hits1 := victimUp("after the scan", hits0)
	healthy("the scan")

	// A connection flood under a cap: the attacker opens 40 connections
	// to the internet at once and holds them until released.
	const maxConns, flood = 8, 40
	if _, err := e.SetNetwork(attacker.ID, egress.Policy{Mode: egress.ModePublic, MaxConnections: maxConns}); err != nil {
		t.Fatal(err)
	}
	if deniedBefore = attacker.NetworkInfo(true).Stats; deniedBefore == nil {
		t.Fatal("no network stats for the attacker")
	}
	host, port, _ := strings.Cut(testnet.WebA, ":")
	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	t.Cleanup(func() { stop(); wg.Wait() }) // the guest kills the flood when its exec is cancelled
	go func() {
		defer wg.Done()
		var out, errb bytes.Buffer
		ev, err := a.Exec(fctx, agentapi.ExecRequest{TimeoutMillis: (5 * time.Minute).Milliseconds(), Shell: fmt.Sprintf(`rm -f /tmp/flood /tmp/release
printf '#!/bin/sh\necho ok >> /tmp/flood\nwhile [ ! -e /tmp/release ]; do sleep 1; done\n' > /tmp/hold && chmod +x /tmp/hold
i=0
while [ $i -lt %d ]; do
	(nc -w 10 %s %s -e /tmp/hold </dev/null >/dev/null 2>&1 || echo fail >> /tmp/flood) &
	i=$((i+1))
done
wait
echo held $(grep -c ok /tmp/flood) refused $(grep -c fail /tmp/flood)`, flood, host, port)}, nil, &out, &errb)
		r := result{out: out.String(), errOut: errb.String(), code: -1}
		if err != nil {
			r.errOut += err.Error()
		} else {
			r.code = ev.ExitCode
		}
		done <- r
	}()
	release := func() {
		t.Helper()
		if out, errOut, code := guestSh(t, a, time.Minute, "touch /tmp/release"); code != 0 {
			t.Fatalf("release the flood: exit %d %q %q", code, out, errOut)
		}
	}
	waitFor(t, 3*time.Minute, "every connection of the flood to be held or refused", func() bool {
		out, _, _ := guestSh(t, a, time.Minute, "cat /tmp/flood 2>/dev/null | wc -l")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n >= flood
	})
	// While the flood holds its connections: the attacker gets no more,
	// the sibling is not affected.
	mustNotFetch(t, a, testnet.WebA)
	healthy("the connection flood")
	release()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the flood did not end after its release")
	}
	var held, refused int
	if _, err := fmt.Sscanf(strings.TrimSpace(r.out), "held %d refused %d", &held, &refused); err != nil || r.code != 0 {
		t.Fatalf("flood: exit %d %q %q", r.code, r.out, r.errOut)
	}
	t.Logf("flood of %d under max_connections %d: %d held, %d refused", flood, maxConns, held, refused)
	if held < 1 || held > maxConns || held+refused != flood {
		t.Errorf("flood of %d under max_connections %d: %d held, %d refused", flood, maxConns, held, refused)
	}
	if st := attacker.NetworkInfo(true).Stats; st == nil || st.DeniedPackets < deniedBefore.DeniedPackets+uint64(refused) {
		t.Errorf("the attacker's denied packets went from %d to %+v over %d refused connections", deniedBefore.DeniedPackets, st, refused)
	}
	// Released, the attacker connects again.
	waitFor(t, 2*time.Minute, "the attacker to connect again once its flood ended", func() bool {
		body, ok := fetch(t, a, "http://"+testnet.WebA+"/")
		return ok && body == "hello from "+testnet.WebA
	})
	victimUp("after the flood", hits1)
	healthy("the flood's end")
	t.Logf("the engine's process RSS: %d MiB before the attacks, %d MiB after", rss0>>20, vmRSS(t, os.Getpid())>>20)
}
