package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

func run(t *testing.T, a *agentclient.Client, argv ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	ev, err := a.Exec(context.Background(), agentapi.ExecRequest{Argv: argv}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	if ev.ExitCode != 0 {
		t.Fatalf("exec %v: exit %d, stderr %q", argv, ev.ExitCode, errb.String())
	}
	return strings.TrimSpace(out.String())
}

func agentOf(t *testing.T, e *sandbox.Engine, id string) *agentclient.Client {
	t.Helper()
	a, err := e.Agent(id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestForkMinimal is the core path: a template from the minimal recipe,
// three children that answer, are distinct, isolated, and leave the
// template's memory image untouched.
func TestForkMinimal(t *testing.T) {
	e := newEngine(t, 2)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()

	sbs, err := e.Fork(ctx, snap.Tag, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 3 {
		t.Fatalf("got %d sandboxes", len(sbs))
	}
	uuids := map[string]string{}
	for _, s := range sbs {
		if s.State() != apiv1.StateRunning || s.ReadyMillis <= 0 {
			t.Fatalf("sandbox %s: state %s ready %.1f", s.ID, s.State(), s.ReadyMillis)
		}
		a := agentOf(t, e, s.ID)
		// Identity: hostname is the sandbox id, the clock is the host's.
		if h := run(t, a, "hostname"); h != s.ID {
			t.Errorf("hostname %q, want %q", h, s.ID)
		}
		// Bracketed by the host's clock before and after asking, so a
		// slow answer on a loaded host is not taken for a wrong clock.
		before := time.Now().Unix()
		guestNow, _ := strconv.ParseInt(run(t, a, "date", "+%s"), 10, 64)
		if after := time.Now().Unix(); guestNow < before-2 || guestNow > after+2 {
			t.Errorf("guest clock %d after restore, want within 2 s of the host's [%d, %d]", guestNow, before, after)
		}
		// The kernel RNG was reseeded per child: no two siblings agree.
		u := run(t, a, "cat", "/proc/sys/kernel/random/uuid")
		if other, dup := uuids[u]; dup {
			t.Errorf("siblings %s and %s produced the same random uuid %s", other, s.ID, u)
		}
		uuids[u] = s.ID
		// Root is the read-only image under an overlay with a tmpfs upper.
		mounts := run(t, a, "cat", "/proc/mounts")
		if !strings.Contains(mounts, "overlay / overlay") {
			t.Errorf("root is not an overlay:\n%s", mounts)
		}
	}

	// File isolation: a file written in one child is absent in its sibling.
	a0, a1 := agentOf(t, e, sbs[0].ID), agentOf(t, e, sbs[1].ID)
	payload := make([]byte, 3<<20+17)
	rand.Read(payload)
	if _, err := a0.WriteFile(ctx, "/root/blob.bin", 0o600, bytes.NewReader(payload)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := a0.ReadFile(ctx, "/root/blob.bin", &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), payload) {
		t.Fatalf("file round trip: got %d bytes, want %d", back.Len(), len(payload))
	}
	if _, err := a1.Stat(ctx, "/root/blob.bin"); !errdefs.IsNotFound(err) {
		t.Fatalf("sibling sees the file: %v", err)
	}

	// Memory isolation inside the guest: tmpfs data differs per child.
	run(t, a0, "sh", "-c", "echo zero > /tmp/who")
	run(t, a1, "sh", "-c", "echo one > /tmp/who")
	if run(t, a0, "cat", "/tmp/who") != "zero" || run(t, a1, "cat", "/tmp/who") != "one" {
		t.Fatal("children share /tmp")
	}

	// Exec streams, reports exit codes, forwards stdin and kills on timeout.
	var out bytes.Buffer
	ev, err := a0.Exec(ctx, agentapi.ExecRequest{Shell: "cat; exit 7", Stdin: true}, strings.NewReader("piped"), &out, io.Discard)
	if err != nil || ev.ExitCode != 7 || out.String() != "piped" {
		t.Fatalf("exec with stdin: exit %d out %q err %v", ev.ExitCode, out.String(), err)
	}
	start := time.Now()
	ev, err = a0.Exec(ctx, agentapi.ExecRequest{Shell: "sleep 100 & sleep 100", TimeoutMillis: 500}, nil, io.Discard, io.Discard)
	if err != nil || !ev.TimedOut || time.Since(start) > time.Minute { // sleep 100 would take longer
		t.Fatalf("exec timeout: %+v err %v after %s", ev, err, time.Since(start))
	}

	// The template's memory image never changes: children map it private.
	if err := snap.Verify(); err != nil {
		t.Fatalf("template changed by its children: %v", err)
	}

	// A child VMM that dies shows as dead with its console; siblings live on.
	syscall.Kill(sbs[2].PID(), syscall.SIGKILL)
	deadline := time.Now().Add(2 * time.Minute)
	for sbs[2].State() == apiv1.StateRunning && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	info := sbs[2].Info()
	if info.State != apiv1.StateDead || info.DeadReason == "" || info.ConsoleTail == "" {
		t.Fatalf("killed VMM: state %q reason %q console %d bytes", info.State, info.DeadReason, len(info.ConsoleTail))
	}
	if _, err := e.Agent(sbs[2].ID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("agent of dead sandbox: %v", err)
	}
	if run(t, a1, "echo", "alive") != "alive" {
		t.Fatal("sibling affected by a dead child")
	}
}

// TestForkBadInput checks the errors a user sees for wrong arguments.
func TestForkBadInput(t *testing.T) {
	e := newEngine(t, 0)
	ctx := context.Background()
	snap := newTemplate(t, e, "minimal")
	if _, err := e.Fork(ctx, snap.Tag, 0); !errdefs.IsInvalidArgument(err) {
		t.Errorf("n=0: %v", err)
	}
	if _, err := e.Fork(ctx, snap.Tag, 21); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("n over limit: %v", err)
	}
	_, err := e.Fork(ctx, "no-such-tag", 1)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), snap.Tag) {
		t.Errorf("unknown tag should be not-found listing %s: %v", snap.Tag, err)
	}
	if _, err := e.Fork(ctx, "Bad/Tag", 1); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "lowercase") {
		t.Errorf("invalid tag should state the rule: %v", err)
	}
	_, err = e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: snap.Tag, Recipe: "minimal"})
	if !errdefs.IsAlreadyExists(err) {
		t.Errorf("existing tag: %v", err)
	}
	_, err = e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: "it-x", Recipe: "no-such-recipe"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "minimal") {
		t.Errorf("unknown recipe should list known recipes: %v", err)
	}
	// run_code without a Python session is a clear precondition error.
	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = agentOf(t, e, sbs[0].ID).RunCode(ctx, agentapi.RunCodeRequest{Code: "1+1"})
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("run_code on minimal: %v", err)
	}
}

// TestChildNetwork: each child has its own namespace with the template's
// guest address and reaches the host side of its tap, its default route
// and name server; under the policy none (an engine's default) nothing
// past it.
func TestChildNetwork(t *testing.T) {
	e := newEngine(t, 0)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range sbs {
		info := s.Info()
		ns, err := netns.Open(info.NetNS, netns.DefaultTap)
		if err != nil {
			t.Fatal(err)
		}
		// A server inside this child's namespace only: the socket belongs to
		// the namespace it was created in.
		var ln net.Listener
		if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", netns.HostAddr+":8080"); return }); err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("hello child %d", i)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, msg) })}
		go srv.Serve(ln)
		a := agentOf(t, e, s.ID)
		// (No -T: busybox 1.35's wget segfaults with it, on the host too.)
		if got := run(t, a, "wget", "-q", "-O", "-", "http://"+netns.HostAddr+":8080/"); got != msg {
			t.Errorf("child %d fetched %q, want %q", i, got, msg)
		}
		srv.Close()
		addrs := run(t, a, "ip", "-4", "addr", "show", "eth0")
		if !strings.Contains(addrs, netns.GuestAddr+"/30") {
			t.Errorf("child %d eth0 lacks %s:\n%s", i, netns.GuestAddr, addrs)
		}
		if routes := run(t, a, "ip", "route"); !strings.Contains(routes, "default via "+netns.HostAddr) {
			t.Errorf("child %d has no default route via %s:\n%s", i, netns.HostAddr, routes)
		}
		if info.Network == nil || info.Network.Policy.Mode != "none" {
			t.Errorf("child %d network %+v, want policy none", i, info.Network)
		}
	}
}
