// Command forkd-agent is the guest agent of forkd: PID 1 in every microVM.
//
// As PID 1 it boots the VM (package boot), then serves the agent API
// (package handler) over the virtio-serial port named "agent" with the
// agentconn transport, for one host after another, until it is told to shut
// down. Build it static, e.g.:
//
//	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -X main.version=v1.2.3' ./cmd/forkd-agent
//
// Not as PID 1 (development), it serves on -port DEVICE or, with
// -serve-stdio, on its stdin/stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/guest/boot"
	"github.com/forkd-dev/forkd/internal/guest/handler"
	"github.com/forkd-dev/forkd/internal/guest/power"
	"github.com/forkd-dev/forkd/internal/guest/procenv"
	"github.com/forkd-dev/forkd/internal/guest/reaper"
)

// version is set at build time with -ldflags '-X main.version=...'.
var version = "dev"

func main() {
	log.SetFlags(0)
	log.SetPrefix("forkd-agent: ")
	// Reap from the first moment: as PID 1 every orphan is ours.
	reaper.Default()
	if os.Getpid() == 1 {
		runInit()
		return
	}
	os.Exit(runDev())
}

// runInit boots the VM and serves until shutdown. PID 1 must never exit
// (the kernel panics), so every fatal error powers the VM off instead, with
// the reason on the console for whoever reads the VM's log.
func runInit() {
	log.Printf("%s starting as init", version)
	res, err := boot.Init(log.Printf)
	if err != nil {
		log.Printf("boot failed: %v", err)
		power.Off(log.Printf)
	}
	shutdown := func() { power.Off(log.Printf) }
	// An image built from an OCI image sets the defaults of execs.
	env, cwd, err := procenv.FromImageConfig(agentapi.ImageConfigPath, procenv.Default)
	if err != nil {
		log.Printf("image config ignored: %v", err)
	}
	user, _ := procenv.ImageUser(agentapi.ImageConfigPath)
	changes := ""
	if res.Upper != nil {
		changes = fmt.Sprintf("/proc/self/fd/%d", res.Upper.Fd())
	}
	agent := handler.New(handler.Config{
		Version:             version,
		ApplySystemIdentity: true,
		Env:                 env,
		Cwd:                 cwd,
		User:                user,
		ChangesDir:          changes,
		Shutdown:            shutdown,
		Logf:                log.Printf,
	})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	go func() {
		s := <-sigs
		log.Printf("%v: shutting down", s)
		shutdown()
	}()
	srv := &agentconn.Server{Handler: agent, OnHello: agent.OnHello}
	if res.AgentVsock {
		// Firecracker: one host connection at a time, each with its own
		// HELLO; a restore resets the one before it.
		ln, err := vsock.Listen(agentapi.VsockPort, nil)
		if err != nil {
			log.Printf("listening on vsock port %d: %v", agentapi.VsockPort, err)
			power.Off(log.Printf)
		}
		log.Printf("serving on vsock port %d", agentapi.VsockPort)
		err = srv.ServeListener(context.Background(), ln)
		log.Printf("vsock listener failed: %v", err)
		power.Off(log.Printf)
	}
	port, err := os.OpenFile(res.AgentPort, os.O_RDWR, 0)
	if err != nil {
		log.Printf("opening the agent port: %v", err)
		power.Off(log.Printf)
	}
	log.Printf("serving on %s", res.AgentPort)
	err = srv.Serve(context.Background(), port)
	log.Printf("agent port failed: %v", err)
	power.Off(log.Printf)
}

// runDev serves without booting anything: for development and tests on a
// host.
func runDev() int {
	fs := flag.NewFlagSet("forkd-agent", flag.ContinueOnError)
	portPath := fs.String("port", "", "serve on this device or FIFO-like file (read/write)")
	stdio := fs.Bool("serve-stdio", false, "serve on stdin/stdout")
	runDir := fs.String("run-dir", "", "runtime directory (default a temporary one)")
	applyIdentity := fs.Bool("apply-identity", false, "set clock, kernel RNG and hostname on HELLO (needs root)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Println(version)
		return 0
	}
	if err := reaper.BecomeSubreaper(); err != nil {
		log.Printf("not a subreaper (%v): orphans are reaped by init", err)
	}
	var port io.ReadWriter
	switch {
	case *stdio:
		port = stdioPort{}
	case *portPath != "":
		f, err := os.OpenFile(*portPath, os.O_RDWR, 0)
		if err != nil {
			log.Print(err)
			return 1
		}
		port = f
	default:
		fmt.Fprintln(os.Stderr, "forkd-agent: not PID 1: give -port DEVICE or -serve-stdio")
		fs.Usage()
		return 2
	}
	dir := *runDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "forkd-agent-"); err != nil {
			log.Print(err)
			return 1
		}
		defer os.RemoveAll(dir)
	}
	agent := handler.New(handler.Config{
		Version:             version,
		ApplySystemIdentity: *applyIdentity,
		RunDir:              dir,
		Logf:                log.Printf,
	})
	defer agent.Close()
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	log.Printf("%s serving (pid %d)", version, os.Getpid())
	err := agentconn.Serve(ctx, port, agent, agent.OnHello)
	if ctx.Err() != nil {
		return 0
	}
	log.Printf("serve: %v", err)
	// Give in-flight logs a moment; stdin EOF is "no host", not an exit.
	time.Sleep(10 * time.Millisecond)
	return 1
}

// stdioPort serves on stdin/stdout. EOF on stdin reads as "no host
// connected", as on virtio-serial.
type stdioPort struct{}

func (stdioPort) Read(b []byte) (int, error)  { return os.Stdin.Read(b) }
func (stdioPort) Write(b []byte) (int, error) { return os.Stdout.Write(b) }
