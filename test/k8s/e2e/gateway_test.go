package e2e_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/controller"
	"github.com/forkd-dev/forkd/k8s/gateway"
)

// otherNS is a second tenant of the gateway, which must not see the
// first's branches.
const otherNS = "others"

// gatewayAccess is the cluster gateway the test runs beside the
// controller: its URL, a user token of the claims' namespace and one of
// otherNS.
type gatewayAccess struct {
	url, token, otherToken string
}

// newToken makes a gateway token and its token-store entry.
func newToken(name, namespace string) (token, entry string) {
	var b [16]byte
	rand.Read(b[:])
	token = "forkd_" + hex.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(token))
	return token, fmt.Sprintf(`{"name":%q,"sha256":%q,"role":"user","tenant":%q}`, name, hex.EncodeToString(sum[:]), namespace)
}

// startGateway serves the gateway over the controller's cache (with its
// id index) and node view, on loopback, as forkd-controller
// --gateway-listen does. Call before the manager starts.
func startGateway(ctx context.Context, t *testing.T, mgr ctrl.Manager, parts *controller.Controllers) *gatewayAccess {
	t.Helper()
	if err := gateway.AddIndexes(ctx, mgr.GetFieldIndexer().IndexField); err != nil {
		t.Fatal(err)
	}
	token, entry := newToken("e2e", claimNS)
	other, otherEntry := newToken("other", otherNS)
	toks, err := gateway.ParseTokens([]byte(`{"version":2,"tokens":[` + entry + "," + otherEntry + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway.Gateway{
		Client: mgr.GetClient(), Nodes: parts.Daemons, Preplacer: parts.Sandboxes, Tokens: toks, DefaultNamespace: claimNS,
		ReadyTimeout: readyTimeout, Version: "e2e", Log: ctrl.Log.WithName("gateway"),
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return &gatewayAccess{url: srv.URL, token: token, otherToken: other}
}

// sdkScript is what a user of one forkd host writes, run against the
// gateway: fork, run a command, find the sandbox by its metadata, kill it.
const sdkScript = `
import os, sys
import forkd
from forkd import Sandbox
c = forkd.Client(host=os.environ["GW_URL"], token=os.environ["GW_TOKEN"])
with Sandbox.create(os.environ["TAG"], client=c, timeout=600, metadata={"via": "gateway"}) as sb:
    r = sb.commands.run("echo via-gateway-$((6*7))")
    if r.exit_code != 0 or r.stdout.strip() != "via-gateway-42":
        sys.exit("command: exit %r stdout %r stderr %r" % (r.exit_code, r.stdout, r.stderr))
    ids = [s.id for s in Sandbox.list(client=c, labels={"via": "gateway"})]
    if sb.id not in ids:
        sys.exit("Sandbox.list(labels=via=gateway) gave %r, not %s" % (ids, sb.id))
    # Branch it mid-task and fork the branch: the child has its state.
    sb.commands.run("echo branched-state > /tmp/state")
    br = sb.branch()
    got = c.snapshots.get(br.tag)
    if got.state != "ready" or br.tag not in [s.tag for s in c.snapshots.list()]:
        sys.exit("branch %s: get %r; listed %r" % (br.tag, got, [s.tag for s in c.snapshots.list()]))
    with Sandbox.create(br.tag, client=c, timeout=600) as child:
        r = child.commands.run("cat /tmp/state")
        if r.stdout.strip() != "branched-state":
            sys.exit("the branch's child read %r, want branched-state" % r.stdout)
        child_id = child.id
    # Another namespace neither sees nor forks it.
    other = forkd.Client(host=os.environ["GW_URL"], token=os.environ["GW_OTHER_TOKEN"])
    for what, call in (("get", lambda: other.snapshots.get(br.tag)),
                       ("fork", lambda: Sandbox.create(br.tag, client=other, timeout=600))):
        try:
            call()
            sys.exit("namespace %s could %s %s's branch %s" % (os.environ["OTHER_NS"], what, os.environ["NS"], br.tag))
        except forkd.NotFound:
            pass
    if br.tag in [s.tag for s in other.snapshots.list()]:
        sys.exit("namespace %s lists the branch %s" % (os.environ["OTHER_NS"], br.tag))
    removed = c.snapshots.delete(br.tag)
    if removed != [br.tag]:
        sys.exit("delete of the branch removed %r" % removed)
    print("sandbox", sb.id, "branch", br.tag, "child", child_id)
`

// checkGateway runs the Python SDK, unchanged, against the gateway: a fork
// becomes a Sandbox object the controller places on the holder, the
// command runs through the proxy to that node; a branch of it, made on
// its node, is listed and forked through the gateway (the child has the
// state written before the branch), while another namespace can neither
// see nor fork it, and it is removed; the kill deletes the object, whose
// finalizer deletes the microVM. Then the TypeScript SDK does the same
// (checkGatewayTS).
func checkGateway(ctx context.Context, t *testing.T, c client.Client, gw *gatewayAccess, root string) {
	t.Helper()
	py, ok := optionalTool(t, "python3", "the gateway check runs the Python SDK")
	if !ok {
		return
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: otherNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	began := time.Now()
	cmd := exec.CommandContext(ctx, py, "-c", sdkScript)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "sdk", "python"),
		"GW_URL="+gw.url, "GW_TOKEN="+gw.token, "GW_OTHER_TOKEN="+gw.otherToken, "TAG="+snapshotTag,
		"NS="+claimNS, "OTHER_NS="+otherNS)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Python SDK against the gateway: %v\n%s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 6 {
		t.Fatalf("the Python SDK printed %q", out)
	}
	t.Logf("Python SDK through the gateway: fork, command, list, branch %s, fork of the branch (%s), refused to namespace %s, removed; kill of %s; in %v",
		f[3], f[5], otherNS, f[1], time.Since(began).Round(time.Millisecond))
	checkGatewayTS(ctx, t, gw, root)
	for _, ns := range []string{claimNS, otherNS} {
		waitFor(t, 2*time.Minute, "the gateway's Sandboxes in "+ns+" to be gone (killed, or undone, through the gateway)", func() (bool, error) {
			var l v1.SandboxList
			if err := c.List(ctx, &l, client.InNamespace(ns), client.HasLabels{gateway.LabelFork}); err != nil {
				return false, err
			}
			return len(l.Items) == 0, nil
		})
	}
}
