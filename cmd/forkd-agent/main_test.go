package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
)

// TestServeStdio builds the agent as it ships (static) and drives it through
// its stdio mode over a socket pair, as a host drives a VM's port.
func TestServeStdio(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "forkd-agent")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -X main.version=v-test", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}

	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	agentEnd := os.NewFile(uintptr(fds[0]), "agent")
	hostEnd := os.NewFile(uintptr(fds[1]), "host")
	defer hostEnd.Close()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-serve-stdio")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = agentEnd, agentEnd, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	agentEnd.Close()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent exit after SIGTERM: %v\n%s", err, stderr.String())
			}
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Errorf("agent ignored SIGTERM")
		}
	}()

	conn, err := net.FileConn(hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sess, ready, err := agentconn.Dial(ctx, conn, agentapi.Hello{Identity: agentapi.Identity{
		SandboxID: "stdio", Entropy: bytes.Repeat([]byte{1}, 32),
	}})
	if err != nil {
		t.Fatalf("Dial: %v\n%s", err, stderr.String())
	}
	defer sess.Close()
	if ready.Info.AgentVersion != "v-test" || ready.Info.SandboxID != "stdio" {
		t.Fatalf("READY: %+v", ready.Info)
	}
	c := agentclient.New(sess)
	var out bytes.Buffer
	ev, err := c.Exec(ctx, agentapi.ExecRequest{Shell: "echo hello from $0"}, nil, &out, nil)
	if err != nil || ev.ExitCode != 0 || out.String() != "hello from /bin/sh\n" {
		t.Fatalf("exec: %+v %v %q", ev, err, out.String())
	}
}
