package handler_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/agentconn/agentconntest"
	"github.com/forkd-dev/forkd/internal/guest/handler"
)

// env is an agent served over a fake virtio-serial port, and a host client.
type env struct {
	t        *testing.T
	port     *agentconntest.Port
	agent    *handler.Agent
	shutdown atomic.Int64
	sess     *agentconn.Session
	c        *agentclient.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, nil)
}

// newEnvWith is newEnv with change applied to the agent's config.
func newEnvWith(t *testing.T, change func(*handler.Config)) *env {
	t.Helper()
	e := &env{t: t, port: &agentconntest.Port{}}
	cfg := handler.Config{
		Version:             "test",
		ApplySystemIdentity: false, // unprivileged: no clock/RNG/hostname
		RunDir:              t.TempDir(),
		Shutdown:            func() { e.shutdown.Add(1) },
		Logf:                func(string, ...any) {},
	}
	if change != nil {
		change(&cfg)
	}
	e.agent = handler.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	srv := &agentconn.Server{Handler: e.agent, OnHello: e.agent.OnHello, Logf: func(string, ...any) {}}
	done := make(chan struct{})
	go func() {
		srv.Serve(ctx, e.port)
		close(done)
	}()
	t.Cleanup(func() {
		if e.sess != nil {
			e.sess.Close()
		}
		cancel()
		e.port.Close()
		<-done
		e.agent.Close()
	})
	e.connect("sb-test", entropy(1))
	return e
}

func entropy(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// connect dials a new session (as a new host after a restore would).
func (e *env) connect(id string, ent []byte) agentapi.Ready {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conn net.Conn = e.port.Connect()
	s, ready, err := agentconn.Dial(ctx, conn, agentapi.Hello{Identity: agentapi.Identity{
		SandboxID: id, Hostname: id, UnixNano: time.Now().UnixNano(), Entropy: ent,
	}})
	if err != nil {
		e.t.Fatalf("Dial: %v", err)
	}
	if e.sess != nil {
		e.sess.Close()
	}
	e.sess = s
	e.c = agentclient.New(s)
	return ready
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestInfoAndIdentity(t *testing.T) {
	e := newEnv(t)
	info, err := e.c.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.SandboxID != "sb-test" || info.ProtocolVersion != agentapi.Version || info.AgentVersion != "test" || info.Kernel == "" || info.Python {
		t.Fatalf("info: %+v", info)
	}
	info, err = e.c.SetIdentity(ctxT(t), agentapi.Identity{SandboxID: "sb-2", Entropy: entropy(2)})
	if err != nil || info.SandboxID != "sb-2" || info.IdentityApplyMicros <= 0 {
		t.Fatalf("SetIdentity: %+v %v", info, err)
	}
	// Too little entropy is refused, and changes nothing.
	if _, err := e.c.SetIdentity(ctxT(t), agentapi.Identity{SandboxID: "sb-3", Entropy: []byte("short")}); err == nil {
		t.Fatal("short entropy accepted")
	}
	if info, _ := e.c.Info(ctxT(t)); info.SandboxID != "sb-2" {
		t.Fatalf("refused identity was applied: %+v", info)
	}
}

func TestShutdown(t *testing.T) {
	e := newEnv(t)
	if err := e.c.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for e.shutdown.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Shutdown hook not called")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestQuiesceThenNewHost(t *testing.T) {
	e := newEnv(t)
	if err := e.c.Quiesce(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// The agent ended its side: the old session takes no new requests. The
	// host keeps the connection open until after the snapshot, then closes.
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := e.c.Info(short); err == nil {
		t.Fatal("request succeeded on a quiesced session")
	}
	e.sess.Close()
	e.sess = nil
	ready := e.connect("sb-child", entropy(9))
	if ready.Info.SandboxID != "sb-child" {
		t.Fatalf("READY after quiesce: %+v", ready)
	}
	if info, err := e.c.Info(ctxT(t)); err != nil || info.SandboxID != "sb-child" {
		t.Fatalf("Info after quiesce: %+v %v", info, err)
	}
}

func TestUnknownPath(t *testing.T) {
	e := newEnv(t)
	resp, err := e.sess.HTTPClient().Get(agentconn.BaseURL + "/v1/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("unknown path: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
