package e2e_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serverName is the name the daemons' certificate carries and the
// controller checks (deploy/gen-secrets.sh, --server-name).
const serverName = "forkd-node"

// credentials are what deploy/gen-secrets.sh makes: a CA and a daemon
// certificate for serverName, and one token of tenant default in a token
// store the daemons read.
type credentials struct {
	dir             string // ca.crt, tls.crt, tls.key, tokens.json
	token           string
	roots           *x509.CertPool
	certFile, keyFN string
}

// newCredentials writes the CA, a certificate for serverName (and, so the
// CLI can reach a daemon by address, for ips), and a token store made by
// `forkd token create`.
func newCredentials(t *testing.T, forkd string, ips []string) *credentials {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "forkd-node-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: serverName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{serverName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	for _, ip := range ips {
		leaf.IPAddresses = append(leaf.IPAddresses, net.ParseIP(ip))
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	writePEM("ca.crt", "CERTIFICATE", caDER)
	c := &credentials{dir: dir, roots: x509.NewCertPool()}
	c.roots.AddCert(ca)
	c.certFile = writePEM("tls.crt", "CERTIFICATE", leafDER)
	c.keyFN = writePEM("tls.key", "EC PRIVATE KEY", keyDER)

	// The daemons' admin, as gen-secrets.sh makes it (the controller acts
	// for each namespace with it), through the CLI that writes the
	// daemon's own token store format.
	var stderr bytes.Buffer
	cmd := exec.Command(forkd, "token", "create", "--token-file", filepath.Join(dir, "tokens.json"),
		"--role", "admin", "forkd-controller")
	cmd.Stderr = &stderr
	out, err := cmd.Output() // the token alone; stderr says what it is
	if err != nil {
		t.Fatalf("forkd token create: %v\n%s", err, stderr.Bytes())
	}
	c.token = strings.TrimSpace(string(out))
	return c
}

// httpClient is a client for the daemons as the controller's main makes
// it: the CA as roots, the certificate checked for serverName.
func (c *credentials) httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.roots, ServerName: serverName}
	tr.TLSHandshakeTimeout = 10 * time.Second
	return &http.Client{Transport: tr}
}

// node is one simulated Kubernetes node: a network namespace joined to the
// test's by a veth pair, and `forkd serve` in it.
type node struct {
	name    string
	ip      string // the daemon's address (the pod IP), in its namespace
	netns   string // /run/netns/NAME
	dataDir string
	runDir  string
	forkd   string
	log     *tailBuffer

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// url is the daemon's API root, as PodDiscovery makes it.
func (n *node) url() string { return "https://" + net.JoinHostPort(n.ip, "7070") }

// ip runs ip(8) and fails t on error.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// startNode makes node name's namespace (index i picks its /30 of
// 198.51.100.0/24: the test's side .4i+1, the node's .4i+2), seeds its data
// dir's image cache, starts its daemon and waits for it to answer over TLS.
func startNode(t *testing.T, name string, i int, creds *credentials, id string) *node {
	t.Helper()
	root := repoRoot(t)
	n := &node{
		name:  name,
		ip:    fmt.Sprintf("198.51.100.%d", 4*i+2),
		forkd: filepath.Join(root, "bin", "forkd"),
		log:   &tailBuffer{max: 4 << 20},
	}
	// Names: the namespace's is free-form, a link's at most 15 bytes.
	nsName := fmt.Sprintf("fke2e-%s-%d", id, i)
	host, peer := fmt.Sprintf("fe%s%dh", id, i), fmt.Sprintf("fe%s%dn", id, i)
	ipCmd(t, "netns", "add", nsName)
	t.Cleanup(func() {
		// Deleting the namespace destroys the veth pair with it.
		if out, err := exec.Command("ip", "netns", "del", nsName).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", nsName, err, out)
		}
	})
	n.netns = filepath.Join("/run/netns", nsName)
	hostIP := fmt.Sprintf("198.51.100.%d", 4*i+1)
	ipCmd(t, "link", "add", host, "type", "veth", "peer", "name", peer)
	ipCmd(t, "link", "set", peer, "netns", nsName)
	ipCmd(t, "addr", "add", hostIP+"/30", "dev", host)
	ipCmd(t, "link", "set", host, "up")
	ipCmd(t, "-n", nsName, "link", "set", "lo", "up")
	ipCmd(t, "-n", nsName, "addr", "add", n.ip+"/30", "dev", peer)
	ipCmd(t, "-n", nsName, "link", "set", peer, "up")
	ipCmd(t, "-n", nsName, "route", "add", "default", "via", hostIP)

	// /var/tmp, as the integration tests' data dir: the VMM jail hides
	// /tmp. The run dir under /run, where the daemon expects sockets.
	var err error
	if n.dataDir, err = os.MkdirTemp("/var/tmp", "forkd-e2e-"+name+"-"); err != nil {
		t.Fatal(err)
	}
	if n.runDir, err = os.MkdirTemp("/run", "forkd-e2e-"+name+"-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(n.runDir)
		os.RemoveAll(n.dataDir)
	})
	seedImageCache(t, n.dataDir)

	// As the DaemonSet runs it (deploy/manifests/30-node.yaml): --listen
	// on the pod IP with TLS and a read-only token store; plus what one
	// host running several daemons needs (own dirs and namespace prefix),
	// --stop-sandboxes so that stopping it leaves no VMM behind, one
	// pooled VMM (TCG on 2 cores), and debug logs for the fork's time.
	n.cmd = daemonCommand(t, n, []string{n.dataDir, n.runDir, creds.dir}, "serve",
		"--data-dir", n.dataDir, "--run-dir", n.runDir,
		"--netns-prefix", fmt.Sprintf("fe%s%d-", id, i),
		"--listen", net.JoinHostPort(n.ip, "7070"),
		"--tls-cert", creds.certFile, "--tls-key", creds.keyFN,
		"--token-file", filepath.Join(creds.dir, "tokens.json"),
		"--stop-sandboxes", "--pool", "1", "--ready-timeout", "5m", "--log-level", "debug")
	n.cmd.Dir = root
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start the daemon of %s: %v", name, err)
	}
	n.exited = make(chan struct{})
	go func() { n.err = n.cmd.Wait(); close(n.exited) }()
	t.Cleanup(func() {
		n.stop(t)
		if t.Failed() {
			l := n.log.String()
			t.Logf("the daemon of %s logged (its last 32 KiB):\n%s", name, l[max(0, len(l)-32<<10):])
		}
	})

	hc := creds.httpClient()
	waitFor(t, 2*time.Minute, "the daemon of "+name+" to answer on "+n.url(), func() (bool, error) {
		select {
		case <-n.exited:
			return false, fmt.Errorf("it exited: %v\n%s", n.err, n.log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		code, body, err := n.call(ctx, hc, creds.token, http.MethodGet, n.url()+"/v1/info", nil, nil)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("GET /v1/info: %d %s", code, body)
		}
		if err != nil {
			return false, notYet(err)
		}
		return true, nil
	})
	return n
}

// seedImageCache copies the guest kernel and the busybox package from the
// integration tests' data dir: the nodes' namespaces reach no apt mirror.
func seedImageCache(t *testing.T, dataDir string) {
	t.Helper()
	shared := filepath.Join(sharedDataDir(), "cache")
	if _, err := os.Stat(filepath.Join(shared, "kernel", "current")); err != nil {
		missing(t, fmt.Sprintf("no guest kernel cached in %s (%v): the nodes' network namespaces cannot fetch one; "+
			"run the integration tests once (make test) to fill it, or set FORKD_TEST_DATA_DIR", shared, err))
	}
	for _, sub := range []string{"kernel", "debs"} {
		if _, err := os.Stat(filepath.Join(shared, sub)); err != nil {
			continue
		}
		dst := filepath.Join(dataDir, "cache")
		if err := os.MkdirAll(dst, 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", filepath.Join(shared, sub), dst).CombinedOutput(); err != nil {
			t.Fatalf("seed the image cache from %s: %v\n%s", shared, err, out)
		}
	}
}

// stop ends the daemon with SIGTERM (with --stop-sandboxes it stops its
// sandboxes first) and waits for it; idempotent.
func (n *node) stop(t *testing.T) {
	t.Helper()
	select {
	case <-n.exited:
		return
	default:
	}
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM the daemon of %s: %v", n.name, err)
	}
	select {
	case <-n.exited:
		if n.err != nil {
			t.Errorf("the daemon of %s exited with %v after SIGTERM:\n%s", n.name, n.err, n.log.String())
		}
	case <-time.After(2 * time.Minute):
		n.cmd.Process.Kill()
		<-n.exited
		t.Errorf("the daemon of %s did not stop in 2 minutes after SIGTERM; killed:\n%s", n.name, n.log.String())
	}
}

// call sends one API request with the bearer token; out, if not nil,
// receives the JSON answer of a 2xx.
func (n *node) call(ctx context.Context, hc *http.Client, token, method, url string, header map[string]string, out any) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, body, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(body, out); err != nil {
			return resp.StatusCode, body, fmt.Errorf("decode %s %s: %w: %s", method, url, err, body)
		}
	}
	return resp.StatusCode, body, nil
}

// forkRequestTimes are the durations of the daemon's POST /v1/sandboxes
// requests, from its debug log, in order.
var forkLine = regexp.MustCompile(`msg=request method=POST path=/v1/sandboxes request_id=\S+ duration=(\S+)`)

func (n *node) forkRequestTimes() []time.Duration {
	var out []time.Duration
	for _, m := range forkLine.FindAllStringSubmatch(n.log.String(), -1) {
		if d, err := time.ParseDuration(m[1]); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// qemuLeftUnder returns the QEMU processes whose command line names a path
// under dir (a VMM's QMP socket lies in its daemon's run dir).
func qemuLeftUnder(dir string) []string {
	dir = filepath.Clean(dir) + "/"
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(data, []byte("qemu-system")) || !bytes.Contains(data, []byte(dir)) {
			continue
		}
		out = append(out, filepath.Base(filepath.Dir(p))+": "+strings.ReplaceAll(string(data), "\x00", " "))
	}
	return out
}

// waitFor polls cond every 20 ms until it holds, fails, or timeout passes.
// An error wrapped by notYet is remembered and reported at the timeout;
// any other fails t at once.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		var ny notYetError
		switch {
		case errors.As(err, &ny):
			last = ny.err
		case err != nil:
			t.Fatalf("waiting for %s: %v", what, err)
		case ok:
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v (last: %v)", what, timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notYet marks an error as a reason to keep waiting.
func notYet(err error) error { return notYetError{err} }

type notYetError struct{ err error }

func (e notYetError) Error() string { return e.err.Error() }

// randomID is 4 hex digits, for names unique to this run.
func randomID() string {
	var b [2]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
