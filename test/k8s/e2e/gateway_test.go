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

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/controller"
	"github.com/forkd-dev/forkd/k8s/gateway"
)

// gatewayAccess is the cluster gateway the test runs beside the
// controller: its URL and a user token of the claims' namespace.
type gatewayAccess struct {
	url, token string
}

// startGateway serves the gateway over the controller's cache (with its
// id index) and node view, on loopback, as forkd-controller
// --gateway-listen does. Call before the manager starts.
func startGateway(ctx context.Context, t *testing.T, mgr ctrl.Manager, parts *controller.Controllers) *gatewayAccess {
	t.Helper()
	if err := gateway.AddIndexes(ctx, mgr.GetFieldIndexer().IndexField); err != nil {
		t.Fatal(err)
	}
	var b [16]byte
	rand.Read(b[:])
	token := "forkd_" + hex.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(token))
	toks, err := gateway.ParseTokens([]byte(fmt.Sprintf(`{"version":2,"tokens":[{"name":"e2e","sha256":%q,"role":"user","tenant":%q}]}`,
		hex.EncodeToString(sum[:]), claimNS)))
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway.Gateway{
		Client: mgr.GetClient(), Nodes: parts.Daemons, Preplacer: parts.Sandboxes, Tokens: toks, DefaultNamespace: claimNS,
		ReadyTimeout: readyTimeout, Version: "e2e", Log: ctrl.Log.WithName("gateway"),
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return &gatewayAccess{url: srv.URL, token: token}
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
    print("sandbox", sb.id)
`

// checkGateway runs the Python SDK, unchanged, against the gateway: a fork
// becomes a Sandbox object the controller places on the holder, the
// command runs through the proxy to that node, and the kill deletes the
// object, whose finalizer deletes the microVM.
func checkGateway(ctx context.Context, t *testing.T, c client.Client, gw *gatewayAccess, root string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("FORKD_K8S_REQUIRED") == "1" {
			t.Fatal("the gateway check runs the Python SDK: install python3")
		}
		t.Log("no python3: the gateway check is skipped")
		return
	}
	began := time.Now()
	cmd := exec.CommandContext(ctx, py, "-c", sdkScript)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "sdk", "python"),
		"GW_URL="+gw.url, "GW_TOKEN="+gw.token, "TAG="+snapshotTag)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Python SDK against the gateway: %v\n%s", err, out)
	}
	id := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "sandbox"))
	t.Logf("Python SDK through the gateway: fork, command, list, kill of %s in %v", id, time.Since(began).Round(time.Millisecond))
	waitFor(t, 2*time.Minute, "the gateway's Sandbox of "+id+" to be gone (killed through the gateway)", func() (bool, error) {
		var l v1.SandboxList
		if err := c.List(ctx, &l, client.InNamespace(claimNS), client.HasLabels{gateway.LabelFork}); err != nil {
			return false, err
		}
		return len(l.Items) == 0, nil
	})
}
