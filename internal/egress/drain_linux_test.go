package egress

import (
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
)

// TestDrain: an ended sandbox's uplink goes with its namespace, and its
// address comes back to the pool only then; a link asked for from the
// exhausted pool meanwhile waits for it instead of failing. An uplink
// whose namespace something still holds is deleted by the drain after
// its timeout.
func TestDrain(t *testing.T) {
	w := testnet.New(t)
	nw, err := NewNetwork(NetworkConfig{
		Pool: "10.231.40.0/29", HostNS: w.Host.Path(), Table: "forkd-drain", DNSUpstream: testnet.Upstream, // two links
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nw.Close()
	nw.drain.timeout = 200 * time.Millisecond
	c, _ := Policy{Mode: ModePublic}.Compile(Options{})
	link := func(id string) (*netns.NS, *Attachment) {
		t.Helper()
		ns := testnet.TapNS(t, "sb")
		a, err := nw.Link(id, ns, c)
		if err != nil {
			t.Fatal(err)
		}
		return ns, a
	}
	uplinks := func() []string {
		up, err := netns.HostUplinks(w.Host.Path(), HostLinkPrefix)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for n := range up {
			names = append(names, n)
		}
		slices.Sort(names)
		return names
	}
	ns1, a1 := link("sb-d1")
	ns2, a2 := link("sb-d2")
	// Nothing draining: an exhausted pool says so at once.
	if _, err := nw.Link("sb-d3", testnet.TapNS(t, "sb"), c); !errdefs.IsUnavailable(err) {
		t.Fatalf("link past the pool: %v", err)
	}

	// sb-d1 ends; the next link waits for its address.
	if err := nw.Unlink(a1); err != nil {
		t.Fatal(err)
	}
	if err := ns1.Remove(); err != nil {
		t.Fatal(err)
	}
	_, a3 := link("sb-d3")
	if a3.Link != a1.Link {
		t.Errorf("sb-d3 got %+v, want sb-d1's freed %+v", a3.Link, a1.Link)
	}
	if got, want := uplinks(), []string{HostLinkName("sb-d2"), HostLinkName("sb-d3")}; !slices.Equal(got, want) {
		t.Errorf("uplinks %v, want %v", got, want)
	}

	// sb-d2's namespace is still held by a socket when it ends.
	var holder net.Listener
	if err := ns2.Do(func() (err error) { holder, err = net.Listen("tcp", netns.HostAddr+":0"); return }); err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	nw.Unlink(a2)
	ns2.Remove()
	deadline := time.Now().Add(time.Minute)
	for nw.Draining() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the held namespace's uplink is still draining after a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := uplinks(), []string{HostLinkName("sb-d3")}; !slices.Equal(got, want) {
		t.Errorf("uplinks %v, want %v", got, want)
	}
	if got := nw.Pool().InUse(); got != 1 {
		t.Errorf("%d links in use, want 1", got)
	}
}
