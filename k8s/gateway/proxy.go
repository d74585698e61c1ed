package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/controller"
)

// IndexSandboxID indexes Sandboxes by status.sandboxID, the id callers
// name them by.
const IndexSandboxID = "status.sandboxID"

// IndexerFunc is what AddIndexes needs of a manager's field indexer.
type IndexerFunc func(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error

// AddIndexes adds the gateway's index to a cache (mgr.GetFieldIndexer()
// .IndexField).
func AddIndexes(ctx context.Context, index IndexerFunc) error {
	return index(ctx, &v1.Sandbox{}, IndexSandboxID, SandboxIDOf)
}

// SandboxIDOf is the index function of IndexSandboxID.
func SandboxIDOf(o client.Object) []string {
	sb, ok := o.(*v1.Sandbox)
	if !ok || sb.Status.SandboxID == "" {
		return nil
	}
	return []string{sb.Status.SandboxID}
}

func httpClient(nc *controller.NodeClient) *http.Client {
	if nc.HTTP != nil {
		return nc.HTTP
	}
	return http.DefaultClient
}

// proxy forwards a request about one sandbox to the daemon on its node,
// path and query unchanged (the gateway's paths are the daemon's), with
// the node token for the caller's, acting for the caller's namespace
// (controller.ActForHeader). Streams (NDJSON, SSE), WebSocket and
// other upgrades pass through; answers are flushed as they come.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, c caller) {
	id := r.PathValue("id")
	sb, err := g.find(r.Context(), c.namespace, id)
	if err != nil {
		g.notFound(w, id, err)
		return
	}
	if !live(sb) {
		writeProblem(w, http.StatusConflict, "failed_precondition",
			fmt.Sprintf("sandbox %s is %s: %s", id, sb.Status.Phase, readyMessage(sb)))
		return
	}
	nc, ok := g.Nodes.Client(sb.Status.NodeName)
	if !ok {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable",
			fmt.Sprintf("sandbox %s is on node %q, which the controller cannot reach now; retry", id, sb.Status.NodeName))
		return
	}
	base, err := url.Parse(nc.Base)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, "internal", fmt.Sprintf("node %s's API URL: %v", sb.Status.NodeName, err))
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(base) // base's path (if any) + the request's
			pr.Out.Header.Set("Authorization", "Bearer "+nc.Token)
			// As the namespace, so what the request makes there (a
			// branch's snapshot) is the namespace's alone.
			pr.Out.Header.Set(controller.ActForHeader, controller.TenantFor(c.namespace))
			pr.SetXForwarded()
		},
		Transport:     httpClient(nc).Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeProblem(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("node %s: %v", sb.Status.NodeName, err))
		},
	}
	rp.ServeHTTP(w, r)
}
