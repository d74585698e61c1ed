package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestPorts: HTTP, WebSocket and raw TCP reach servers inside a sandbox
// through the daemon (which dials them from the sandbox's namespace), over
// its Unix socket and over TCP with a token; the token is not passed on to
// the app.
func TestPorts(t *testing.T) {
	c := newCLI(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	// A user of tenant default: the sandboxes made below over the Unix
	// socket (an admin of default) are its.
	token := strings.TrimSpace(c.ok("token", "create", "--token-file", tokens, "--tenant", "default", "it-ports"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	var serveLog bytes.Buffer
	serve := c.cmd("serve", "--listen", listen, "--token-file", tokens)
	serve.Stdout, serve.Stderr = &serveLog, &serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve.Wait() }()
	t.Cleanup(func() {
		// Sandboxes first, while this daemon answers: the data dir's state
		// is shared, and a sandbox left running would be adopted by the
		// next test's daemon (newCLI's kill --all runs after this).
		c.run("--no-autostart", "kill", "--all")
		stopServe(t, serve, served, &serveLog)
	})
	waitFor(t, 2*time.Minute, "the daemon to answer:\n"+serveLog.String(), func() bool {
		_, _, code := c.run("--no-autostart", "ls")
		return code == 0
	})

	tag := "it-ports-" + snapshot.NewID()
	c.ok("--no-autostart", "snapshot", "create", "--tag", tag, "--recipe", filepath.Join(repoRoot, "integration", "testdata", "py-min.toml"))
	defer c.run("rmi", tag)
	id := strings.TrimSpace(c.ok("--no-autostart", "fork", "--tag", tag, "-q"))
	c.ok("--no-autostart", "cp", filepath.Join(repoRoot, "integration", "testdata", "portsrv.py"), id+":/tmp/portsrv.py")
	c.ok("--no-autostart", "exec", id, "--", "sh", "-c", "python3 /tmp/portsrv.py >/tmp/portsrv.log 2>&1 &")

	hc := unixHTTP(filepath.Join(c.runDir, "forkd.sock"))
	base := "http://forkd/v1/sandboxes/" + id + "/ports/"
	get := func(client *http.Client, url, token string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	waitFor(t, 2*time.Minute, "the app in the sandbox to answer", func() bool {
		resp, _ := get(hc, base+"8765/ready", "")
		return resp.StatusCode == http.StatusOK
	})

	// HTTP over the Unix socket, the rest of the path passed on.
	resp, body := get(hc, base+"8765/a/b?c=d", "")
	var echo struct {
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
	}
	if err := json.Unmarshal(body, &echo); err != nil || resp.StatusCode != 200 || echo.Path != "/a/b?c=d" {
		t.Errorf("proxied GET = %d %s (%v)", resp.StatusCode, body, err)
	}
	// The app's own Authorization (not a forkd bearer token) reaches it
	// over the socket, untouched.
	basic, _ := http.NewRequest(http.MethodGet, base+"8765/basic", nil)
	basic.SetBasicAuth("app-user", "app-pass")
	if resp, err := hc.Do(basic); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		echo.Headers = nil
		if err := json.Unmarshal(body, &echo); err != nil || resp.StatusCode != 200 || echo.Headers["Authorization"] != basic.Header.Get("Authorization") {
			t.Errorf("app's Basic auth over the socket = %d %s (%v)", resp.StatusCode, body, err)
		}
	}
	// `forkd port` names that URL.
	if u := strings.TrimSpace(c.ok("--no-autostart", "port", id, "8765")); u != base+"8765/" {
		t.Errorf("forkd port = %q, want %q", u, base+"8765/")
	}
	// A port nothing listens on, and a bad one, say so.
	if resp, body := get(hc, base+"8766/", ""); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "8766") {
		t.Errorf("closed port = %d %s", resp.StatusCode, body)
	}
	if resp, body := get(hc, base+"0/", ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("port 0 = %d %s", resp.StatusCode, body)
	}

	// Over TCP: the token is required, and not passed on to the app.
	tcp := &http.Client{}
	tcpBase := "http://" + listen + "/v1/sandboxes/" + id + "/ports/"
	if resp, _ := get(tcp, tcpBase+"8765/x", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("proxy without a token = %d, want 401", resp.StatusCode)
	}
	resp, body = get(tcp, tcpBase+"8765/x", token)
	echo.Headers = nil
	if err := json.Unmarshal(body, &echo); err != nil || resp.StatusCode != 200 {
		t.Fatalf("proxy with a token = %d %s", resp.StatusCode, body)
	}
	for k := range echo.Headers {
		if strings.EqualFold(k, "Authorization") {
			t.Errorf("the app received the API token: %v", echo.Headers)
		}
	}

	// WebSocket through the proxy, on both listeners.
	wsEcho(t, "unix", filepath.Join(c.runDir, "forkd.sock"), "/v1/sandboxes/"+id+"/ports/8765/ws", "", "hello over unix")
	wsEcho(t, "tcp", listen, "/v1/sandboxes/"+id+"/ports/8765/ws", token, "hello over tcp")

	// Raw TCP: forkd port-forward to the echo server.
	pf := c.cmd("--no-autostart", "port-forward", id, "0:9000")
	stderr, _ := pf.StderrPipe()
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { pf.Process.Kill(); pf.Wait() }()
	line, err := bufio.NewReader(stderr).ReadString('\n')
	m := regexp.MustCompile(`forwarding (127\.0\.0\.1:\d+) `).FindStringSubmatch(line)
	if err != nil || m == nil {
		t.Fatalf("port-forward said %q, %v", line, err)
	}
	for i := range 3 { // each connection its own tunnel
		conn, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Minute))
		msg := fmt.Sprintf("ping %d\n", i)
		io.WriteString(conn, msg)
		got, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil || got != msg {
			t.Errorf("echo through port-forward = %q, %v; want %q", got, err, msg)
		}
	}
	var info apiv1.Sandbox
	json.Unmarshal([]byte(c.ok("--no-autostart", "sandbox", "info", id, "--json")), &info)
	if info.State != apiv1.StateRunning {
		t.Errorf("sandbox after the port tests: %+v", info)
	}
}

// wsEcho sends one WebSocket text message through the proxy at path and
// checks the app echoes it.
func wsEcho(t *testing.T, network, addr, path, token, msg string) {
	t.Helper()
	conn, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: forkd\r\n%sUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", path, auth)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("WebSocket upgrade over %s: %v %v", network, resp, err)
	}
	mask := []byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg))}
	frame = append(frame, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	conn.Write(frame)
	head := make([]byte, 2)
	if _, err := io.ReadFull(br, head); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, head[1]&0x7f)
	if _, err := io.ReadFull(br, got); err != nil || head[0] != 0x81 || string(got) != msg {
		t.Errorf("WebSocket echo over %s = %x %q, %v; want %q", network, head, got, err, msg)
	}
}

// waitFor polls cond until it holds, failing the test after limit.
// stopServe stops a test's own `forkd serve` as an operator does, with
// SIGTERM, so it stops its pooled VMMs: a SIGKILL leaves them running
// (by design, for the next daemon to find), and a pool restored ahead
// keeps running guests that took CPU from every later test. served
// receives the process's exit.
func stopServe(t *testing.T, serve *exec.Cmd, served <-chan error, log fmt.Stringer) {
	t.Helper()
	serve.Process.Signal(syscall.SIGTERM)
	select {
	case <-served:
	case <-time.After(3 * time.Minute):
		serve.Process.Kill()
		<-served
		t.Errorf("forkd serve did not stop on SIGTERM within 3 minutes; log:\n%s", log)
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
