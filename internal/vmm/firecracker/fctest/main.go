package fctest

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// Environment of Main, for tests that start the fake as a process.
const (
	// EnvCallLog names a file that receives every Call as a JSON line.
	EnvCallLog = "FCTEST_CALL_LOG"
	// EnvFaults holds faults to inject, separated by ";":
	// "PUT /snapshot/load=400:message".
	EnvFaults = "FCTEST_FAULTS"
)

// Main runs the fake as a firecracker process: it takes firecracker's
// command line (--api-sock, --id; other flags are accepted and ignored),
// serves the API on the socket, writes the console to stdout, and exits
// 0 on SIGTERM or when the guest asks to stop (SendCtrlAltDel). Test
// binaries call it from TestMain to stand in for the firecracker binary.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("firecracker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := fs.String("api-sock", "/run/firecracker.socket", "API socket")
	id := fs.String("id", "anonymous-instance", "instance id")
	for _, name := range []string{"log-path", "level", "seccomp-filter", "config-file", "metrics-path"} {
		fs.String(name, "", "ignored")
	}
	for _, name := range []string{"boot-timer", "no-seccomp", "show-level", "show-log-origin", "no-api"} {
		fs.Bool(name, false, "ignored")
	}
	version := fs.Bool("version", false, "print the version")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	spec, err := Firecracker()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *version {
		fmt.Fprintf(stdout, "Firecracker v%s\n\nfctest: a contract-test fake, not Firecracker\n", spec.Version)
		return 0
	}
	srv := NewServer(spec, *id, stdout)
	if p := os.Getenv(EnvCallLog); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer f.Close()
		srv.callLog = f
	}
	for _, spec := range strings.Split(os.Getenv(EnvFaults), ";") {
		if spec == "" {
			continue
		}
		req, resp, _ := strings.Cut(spec, "=")
		method, path, _ := strings.Cut(req, " ")
		code, msg, _ := strings.Cut(resp, ":")
		status, err := strconv.Atoi(code)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %q: %v\n", EnvFaults, spec, err)
			return 2
		}
		srv.Fail(method, path, status, msg)
	}
	l, err := net.Listen("unix", *sock)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer os.Remove(*sock)
	defer srv.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go srv.Serve(l)
	select {
	case <-sigs:
	case <-srv.Stopped():
	}
	l.Close()
	return 0
}
