//go:build linux

// Command vsockagent is the test guest's agent where the VM has no
// virtio-serial port (Firecracker): it serves testguest's line protocol
// (ping, set, get, run) on vsock port 1024, the port forkd-agent uses, one
// host connection at a time, a new one superseding the last (a restore
// resets the connection from before the snapshot). testguest's /init runs
// it; the state "set" stores lives in /tmp, in guest RAM, as with the
// shell agent.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/mdlayher/vsock"
)

// port is forkd-agent's vsock port.
const port = 1024

func main() {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vsockagent:", err)
		os.Exit(1)
	}
	fmt.Printf("agent: vsock port %d\n", port)
	var mu sync.Mutex
	var current net.Conn
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "vsockagent: accept:", err)
			continue
		}
		mu.Lock()
		if current != nil {
			current.Close()
		}
		current = c
		mu.Unlock()
		go serve(c)
	}
}

func serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		cmd, arg, _ := strings.Cut(strings.TrimRight(line, "\n"), " ")
		var reply string
		switch cmd {
		case "ping":
			reply = "pong"
		case "set":
			if err := os.WriteFile("/tmp/state", []byte(arg+"\n"), 0o600); err != nil {
				reply = "error: " + err.Error()
			} else {
				reply = "ok"
			}
		case "get":
			b, _ := os.ReadFile("/tmp/state")
			reply = "state=" + strings.TrimRight(string(b), "\n")
		case "run":
			out, _ := exec.Command("/bin/sh", "-c", arg).CombinedOutput()
			reply = strings.ReplaceAll(string(out), "\n", " ")
		default:
			reply = "echo: " + cmd + " " + arg
		}
		if _, err := fmt.Fprintln(c, reply); err != nil {
			return
		}
	}
}
