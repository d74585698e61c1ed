package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
)

// Network tests route sandboxes into a world of namespaces the test makes
// (internal/testutil/testnet): the engine's host namespace is the world's,
// whose only routes lead to the test's own servers; the resolver's
// upstream is the world's DNS server. No packet leaves those namespaces.

// netEngine is an engine whose sandboxes' uplinks lead into w, numbered
// from pool (distinct per test: engines share the kernel).
func netEngine(t *testing.T, w *testnet.World, pool string, poolSize int) *sandbox.Engine {
	t.Helper()
	return newEngineOn(t, dataDir, poolSize, func(c *sandbox.Config) {
		c.Network = sandbox.NetworkConfig{Pool: pool, HostNS: w.Host.Path(), DNSUpstream: testnet.Upstream}
		c.MaxForkCount = 100
	})
}

// fetch runs busybox wget in the guest; ok is its success.
func fetch(t *testing.T, a *agentclient.Client, url string) (body string, ok bool) {
	t.Helper()
	var out, errb bytes.Buffer
	ev, err := a.Exec(context.Background(), agentapi.ExecRequest{Argv: []string{"wget", "-q", "-O", "-", url}}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec wget %s: %v", url, err)
	}
	return strings.TrimSpace(out.String()), ev.ExitCode == 0
}

func mustFetch(t *testing.T, a *agentclient.Client, host, addr string) {
	t.Helper()
	if body, ok := fetch(t, a, "http://"+host+"/"); !ok || body != "hello from "+addr {
		t.Errorf("wget http://%s/ = %q (ok %v); want it served by %s", host, body, ok, addr)
	}
}

func mustNotFetch(t *testing.T, a *agentclient.Client, host string) {
	t.Helper()
	if body, ok := fetch(t, a, "http://"+host+"/"); ok {
		t.Errorf("wget http://%s/ = %q; want it refused", host, body)
	}
}

func policy(t *testing.T, spec string) *egress.Policy {
	t.Helper()
	p, err := egress.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

// TestEgressPolicies: real guests under each policy, a change on a running
// sandbox, and a branch whose children keep their source's policy.
func TestEgressPolicies(t *testing.T) {
	w := testnet.New(t)
	e := netEngine(t, w, "10.231.10.0/24", 1)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()

	pub, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 1, Network: policy(t, "public")})
	if err != nil {
		t.Fatal(err)
	}
	a := agentOf(t, e, pub[0].ID)
	mustFetch(t, a, testnet.WebA, testnet.WebA)
	mustFetch(t, a, "api.example.org:8080", testnet.WebB) // through forkd's resolver
	for _, h := range []string{testnet.TrapPriv, testnet.TrapMeta, testnet.HostSvc} {
		mustNotFetch(t, a, h)
	}

	allow, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 1, Network: policy(t, "allow:allowed.example.com,198.51.100.20:8080/tcp")})
	if err != nil {
		t.Fatal(err)
	}
	b := agentOf(t, e, allow[0].ID)
	mustFetch(t, b, "allowed.example.com", testnet.WebA)
	mustFetch(t, b, testnet.WebB, testnet.WebB)
	mustNotFetch(t, b, "other.example.com:8080") // refused by the resolver
	mustNotFetch(t, b, "198.51.100.20")          // port 80 is not listed
	if got := allow[0].Info().Network; got == nil || got.Policy.Mode != "allow" {
		t.Errorf("info network = %+v", got)
	}

	// A branch's children keep the source's policy.
	branchTag := "it-net-branch-" + snapshot.NewID()
	if _, err := e.Branch(ctx, allow[0].ID, sandbox.BranchOptions{Tag: branchTag}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), branchTag) })
	kids, err := e.Fork(ctx, branchTag, 1)
	if err != nil {
		t.Fatal(err)
	}
	k := agentOf(t, e, kids[0].ID)
	mustFetch(t, k, "allowed.example.com", testnet.WebA)
	mustNotFetch(t, k, "198.51.100.20")
	if got := kids[0].Info().Network.Policy; got.Mode != "allow" || len(got.Allow) != 2 {
		t.Errorf("branch child's policy %+v, want its source's", got)
	}

	// Changed on a running sandbox: closed at once.
	if _, err := e.SetNetwork(allow[0].ID, egress.Policy{Mode: egress.ModeNone}); err != nil {
		t.Fatal(err)
	}
	mustNotFetch(t, b, testnet.WebB)
	sb, _ := e.Get(allow[0].ID)
	if st := sb.NetworkInfo(true).Stats; st == nil || st.TxPackets == 0 || st.DeniedPackets == 0 {
		t.Errorf("stats after traffic and refusals: %+v", st)
	}
	// Bad policies are refused naming the problem, and change nothing.
	if _, err := e.SetNetwork(pub[0].ID, egress.Policy{Mode: egress.ModeAllow, Allow: []string{"169.254.169.254"}}); err == nil || !strings.Contains(err.Error(), "reserved range") {
		t.Errorf("allowing the metadata address: %v", err)
	}
	mustFetch(t, a, testnet.WebA, testnet.WebA)
}

// TestManyNetworkedChildren: children of one snapshot, each with its own
// namespace, uplink and rules, reach the test host at once.
func TestManyNetworkedChildren(t *testing.T) {
	n := 100
	if testing.Short() {
		n = 10
	}
	w := testnet.New(t)
	e := netEngine(t, w, "10.231.12.0/22", 0)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()
	var sbs []*sandbox.Sandbox
	for len(sbs) < n {
		batch, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: min(50, n-len(sbs)), Network: policy(t, "public")})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, batch...)
	}
	var wg sync.WaitGroup
	errs := make([]string, len(sbs))
	for i, s := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := e.Agent(s.ID)
			if err != nil {
				errs[i] = err.Error()
				return
			}
			var out, errb bytes.Buffer
			ev, err := a.Exec(ctx, agentapi.ExecRequest{Argv: []string{"wget", "-q", "-O", "-", "http://" + testnet.WebA + "/"}}, nil, &out, &errb)
			switch {
			case err != nil:
				errs[i] = err.Error()
			case ev.ExitCode != 0 || strings.TrimSpace(out.String()) != "hello from "+testnet.WebA:
				errs[i] = fmt.Sprintf("exit %d, %q, %q", ev.ExitCode, out.String(), errb.String())
			}
		}()
	}
	wg.Wait()
	failed := 0
	for i, msg := range errs {
		if msg != "" {
			failed++
			if failed <= 5 {
				t.Errorf("child %d (%s): %s", i, sbs[i].ID, msg)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d children could not reach the test host", failed, len(sbs))
	}
}

// TestNetworkAcrossRestart: a daemon killed with -9 and started again
// takes its sandboxes' networks back (rules, resolver, pool address) and
// removes the uplink of one that died while it was down.
func TestNetworkAcrossRestart(t *testing.T) {
	w := testnet.New(t)
	c := newCLI(t)
	c.env = append(c.env, "FORKD_NETWORK=public", "FORKD_NETWORK_HOST_NETNS="+w.Host.Path(),
		"FORKD_NETWORK_POOL=10.231.20.0/24", "FORKD_NETWORK_DNS_UPSTREAM="+testnet.Upstream)
	tag := "it-netrestart-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)
	keep := strings.TrimSpace(c.ok("fork", "--tag", tag, "-q", "--network", "allow:allowed.example.com"))
	var lost apiv1.Sandbox
	lostID := strings.TrimSpace(c.ok("fork", "--tag", tag, "-q"))
	// It will be dead after the restart, and a dead sandbox stays listed
	// (in the data dir's state, which the tests share) until killed.
	t.Cleanup(func() { c.run("--no-autostart", "kill", lostID) })
	json.Unmarshal([]byte(c.ok("sandbox", "info", lostID, "--json")), &lost)
	wget := func(id, url string) (string, int) {
		out, _, code := c.run("--no-autostart", "exec", id, "--", "wget", "-q", "-O", "-", url)
		return strings.TrimSpace(out), code
	}
	if out, code := wget(keep, "http://allowed.example.com/"); code != 0 || out != "hello from "+testnet.WebA {
		t.Fatalf("before the restart: %q exit %d", out, code)
	}
	if uplinks, _ := netns.HostUplinks(w.Host.Path(), egress.HostLinkPrefix); !uplinks[egress.HostLinkName(lostID)].IsValid() {
		t.Fatalf("uplinks before the restart: %v", uplinks)
	}

	pid := c.daemonPID()
	syscall.Kill(pid, syscall.SIGKILL)
	waitGone(t, pid)
	syscall.Kill(lost.PID, syscall.SIGKILL) // dies while no daemon runs
	waitGone(t, lost.PID)
	c.ok("daemon", "start")

	// The kept sandbox resolves (its resolver is back) and connects (its
	// rules never left); what it may not reach, it still may not.
	if out, code := wget(keep, "http://allowed.example.com/"); code != 0 || out != "hello from "+testnet.WebA {
		t.Errorf("after the restart: %q exit %d", out, code)
	}
	if _, code := wget(keep, "http://"+testnet.WebB+"/"); code == 0 {
		t.Error("after the restart the allow-list no longer holds")
	}
	if got := c.ok("sandbox", "network", keep); !strings.Contains(got, "allow:allowed.example.com") {
		t.Errorf("sandbox network after the restart:\n%s", got)
	}
	waitFor(t, 2*time.Minute, "the dead sandbox's uplink to go", func() bool {
		uplinks, _ := netns.HostUplinks(w.Host.Path(), egress.HostLinkPrefix)
		_, lostLeft := uplinks[egress.HostLinkName(lostID)]
		_, kept := uplinks[egress.HostLinkName(keep)]
		return !lostLeft && kept // (pooled VMMs have uplinks too)
	})
}

// TestNetworkPoolExhausted: a fork that finds no free uplink address fails
// with ErrUnavailable naming the pool, and leaves no namespace, uplink or
// VMM behind; the sandboxes already running keep theirs.
func TestNetworkPoolExhausted(t *testing.T) {
	w := testnet.New(t)
	e := netEngine(t, w, "10.231.30.0/29", 0) // two links
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()
	sbs, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 2, Network: policy(t, "public")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 1, Network: policy(t, "public")})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "10.231.30.0/29") {
		t.Fatalf("fork past the pool: %v", err)
	}
	prefix := e.Config().NetNSPrefix
	if names, _ := netns.List(prefix); len(names) != 2 {
		t.Errorf("namespaces after the refused fork: %v", names)
	}
	if up, _ := netns.HostUplinks(w.Host.Path(), egress.HostLinkPrefix); len(up) != 2 {
		t.Errorf("uplinks after the refused fork: %v", up)
	}
	if got := len(e.List()); got != 2 {
		t.Errorf("%d sandboxes listed", got)
	}
	// A fork that needs no uplink still works, and a freed address is
	// taken again.
	if _, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 1, Network: policy(t, "none")}); err != nil {
		t.Errorf("fork with none: %v", err)
	}
	if _, err := e.Kill(ctx, []string{sbs[0].ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ForkWith(ctx, sandbox.ForkOptions{Tag: snap.Tag, Count: 1, Network: policy(t, "public")}); err != nil {
		t.Errorf("fork after a kill freed an address: %v", err)
	}
}
