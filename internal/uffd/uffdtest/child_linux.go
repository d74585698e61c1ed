package uffdtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Environment of a child started by StartChild.
const (
	envSocket = "FORKD_UFFDTEST_SOCKET"
	envSize   = "FORKD_UFFDTEST_SIZE"
)

// RunChild, called first in TestMain, makes a process StartChild started
// a Guest: it attaches to the socket, prints "sha256 HEX" of its memory
// and exits when its standard input closes. In any other process it
// returns at once.
func RunChild() {
	sock := os.Getenv(envSocket)
	if sock == "" {
		return
	}
	size, err := strconv.Atoi(os.Getenv(envSize))
	if err == nil {
		var g *Guest
		if g, err = Attach(sock, size); err == nil {
			fmt.Printf("sha256 %s\n", g.Digest())
			io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		}
	}
	fmt.Fprintln(os.Stderr, "uffdtest child:", err)
	os.Exit(1)
}

// Child is a Guest in a child process.
type Child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// StartChild re-executes the test binary (whose TestMain calls RunChild)
// as a Guest of size bytes attached to socket.
func StartChild(socket string, size int) (*Child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envSocket+"="+socket, envSize+"="+strconv.Itoa(size))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Child{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}, nil
}

// Digest waits for the child's digest of its memory (read through the
// page server).
func (c *Child) Digest() (string, error) {
	line, err := c.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("uffdtest child: %w (exit: %v)", err, c.cmd.Wait())
	}
	d, ok := strings.CutPrefix(strings.TrimSpace(line), "sha256 ")
	if !ok {
		return "", fmt.Errorf("uffdtest child said %q", line)
	}
	return d, nil
}

// Close ends the child.
func (c *Child) Close() error {
	c.stdin.Close()
	return c.cmd.Wait()
}
