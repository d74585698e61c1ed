package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/k8s/controller"
)

// This file serves the snapshot routes cluster-wide: a snapshot lives on
// the nodes that hold it (built there, pulled there, or branched there
// from a sandbox through the gateway), so each route asks every node's
// daemon, acting for the caller's namespace (controller.ActForHeader):
// a namespace sees its own snapshots (a branch of its sandbox), those
// shared with it, and the nodes' operator's (base images), never another
// namespace's.

// Fan-out bounds: how long one node may take.
const (
	fanOutTimeout = 10 * time.Second
	// maxNodeAnswer bounds what is read of one daemon's answer.
	maxNodeAnswer = 16 << 20
)

// nodeAnswer is one daemon's answer to a fanned-out request.
type nodeAnswer struct {
	node   string
	status int
	body   []byte
	err    error // no answer (unreachable, timed out, unreadable)
}

// callNode sends one request to a node's daemon acting for tenant.
func callNode(ctx context.Context, nc *controller.NodeClient, tenant, method, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(nc.Base, "/")+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+nc.Token)
	req.Header.Set(controller.ActForHeader, tenant)
	req.Header.Set("Accept", "application/json")
	resp, err := httpClient(nc).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeAnswer+1))
	if err == nil && len(body) > maxNodeAnswer {
		err = fmt.Errorf("answer over %d bytes", maxNodeAnswer)
	}
	return resp.StatusCode, body, err
}

// fanOut runs call on every node (controller.FanOut: 16 at a time), each
// within fanOutTimeout, and returns the answers sorted by node name.
func fanOut(ctx context.Context, nodes map[string]*controller.NodeClient, call func(ctx context.Context, nc *controller.NodeClient) (int, []byte, error)) []nodeAnswer {
	out := make([]nodeAnswer, 0, len(nodes))
	for node := range nodes {
		out = append(out, nodeAnswer{node: node})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].node < out[j].node })
	controller.FanOut(ctx, len(out), fanOutTimeout, func(ctx context.Context, i int) {
		a := &out[i]
		a.status, a.body, a.err = call(ctx, nodes[a.node])
	})
	return out
}

// answered says a node gave an answer about the snapshot: it holds it
// for the caller (200) or not (404). Anything else (no answer, 5xx, a
// refused node token, a node's rate limit) leaves it unknown.
func answered(a nodeAnswer) bool {
	return a.err == nil && (a.status == http.StatusOK || a.status == http.StatusNotFound)
}

// warnUnreachable names, in a Warning header (RFC 9111's 299), the nodes
// that did not answer, so a partial answer does not pass for a whole one.
func warnUnreachable(w http.ResponseWriter, answers []nodeAnswer) {
	var gone []string
	for _, a := range answers {
		if !answered(a) {
			gone = append(gone, a.node)
		}
	}
	if len(gone) > 0 {
		w.Header().Set("Warning", fmt.Sprintf(`299 forkd-gateway "no answer from node(s) %s: their snapshots are missing from this answer"`, strings.Join(gone, ", ")))
	}
}

// snapshotItem is a daemon's Snapshot, kept whole, with the nodes the
// gateway found it on.
type snapshotItem = map[string]any

func tagOf(s snapshotItem) string { t, _ := s["tag"].(string); return t }

// mergeSnapshot adds one node's view of a snapshot to by: the first
// node's description (a ready one over one being written), and every node
// holding it in "nodes".
func mergeSnapshot(by map[string]snapshotItem, node string, s snapshotItem) {
	tag := tagOf(s)
	if tag == "" {
		return
	}
	have, ok := by[tag]
	if !ok || (have["state"] != "ready" && s["state"] == "ready") {
		nodes, _ := have["nodes"].([]string)
		s["nodes"] = nodes
		by[tag], have = s, s
	}
	have["nodes"] = append(have["nodes"].([]string), node)
}

// listSnapshots is GET /v1/snapshots: every node's snapshots the caller
// sees, one entry per tag with the nodes holding it, in one page sorted
// by tag.
func (g *Gateway) listSnapshots(w http.ResponseWriter, r *http.Request, c caller) {
	nodes := g.Nodes.All()
	if len(nodes) == 0 {
		noNodes(w)
		return
	}
	filter := r.URL.Query()
	filter.Del("cursor")
	filter.Set("limit", "1000")
	answers := fanOut(r.Context(), nodes, func(ctx context.Context, nc *controller.NodeClient) (int, []byte, error) {
		q := url.Values{}
		for k, v := range filter {
			q[k] = v
		}
		var items []json.RawMessage
		total, seen := 0, map[string]bool{}
		for page := 0; ; page++ {
			if page > 1000 || total > maxNodeAnswer {
				return 0, nil, fmt.Errorf("over 1000 pages or %d bytes of snapshots", maxNodeAnswer)
			}
			status, body, err := callNode(ctx, nc, controller.TenantFor(c.namespace), http.MethodGet, "/v1/snapshots?"+q.Encode())
			if err != nil || status != http.StatusOK {
				return status, body, err
			}
			total += len(body)
			var l struct {
				Items      []json.RawMessage `json:"items"`
				NextCursor string            `json:"next_cursor"`
			}
			if err := json.Unmarshal(body, &l); err != nil {
				return 0, nil, fmt.Errorf("decoding the snapshot list: %w", err)
			}
			items = append(items, l.Items...)
			if l.NextCursor == "" {
				all, err := json.Marshal(items)
				return http.StatusOK, all, err
			}
			if seen[l.NextCursor] {
				return 0, nil, fmt.Errorf("the snapshot list's cursor %q came back", l.NextCursor)
			}
			seen[l.NextCursor] = true
			q.Set("cursor", l.NextCursor)
		}
	})
	by := map[string]snapshotItem{}
	for _, a := range answers {
		if a.err != nil || a.status != http.StatusOK {
			if a.err == nil && a.status == http.StatusBadRequest {
				// A bad filter is the caller's: the daemon says which.
				forwardProblem(w, a)
				return
			}
			continue // named in the Warning
		}
		var items []snapshotItem
		if json.Unmarshal(a.body, &items) != nil {
			continue
		}
		for _, s := range items {
			mergeSnapshot(by, a.node, s)
		}
	}
	items := make([]snapshotItem, 0, len(by))
	for _, s := range by {
		items = append(items, s)
	}
	sort.Slice(items, func(i, j int) bool { return tagOf(items[i]) < tagOf(items[j]) })
	warnUnreachable(w, answers)
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// getSnapshot is GET /v1/snapshots/{tag}: the snapshot as its holders
// describe it (a ready copy over one being written), with "nodes".
func (g *Gateway) getSnapshot(w http.ResponseWriter, r *http.Request, c caller) {
	tag := r.PathValue("tag")
	answers, ok := g.eachNode(w, r, c, http.MethodGet, "/v1/snapshots/"+url.PathEscape(tag))
	if !ok {
		return
	}
	by := map[string]snapshotItem{}
	for _, a := range answers {
		var s snapshotItem
		if a.err == nil && a.status == http.StatusOK && json.Unmarshal(a.body, &s) == nil {
			mergeSnapshot(by, a.node, s)
		}
	}
	warnUnreachable(w, answers)
	if s, ok := by[tag]; ok {
		writeJSON(w, http.StatusOK, s)
		return
	}
	g.noSnapshot(w, tag, answers)
}

// deleteSnapshot is DELETE /v1/snapshots/{tag}: removed from every node
// that holds it, as the daemon removes it (its query, cascade and force,
// passed on). A node that refuses (a tag of the operator's, dependents
// without cascade) answers for all; the nodes that removed it say so in
// "removed".
func (g *Gateway) deleteSnapshot(w http.ResponseWriter, r *http.Request, c caller) {
	tag := r.PathValue("tag")
	path := "/v1/snapshots/" + url.PathEscape(tag)
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	answers, ok := g.eachNode(w, r, c, http.MethodDelete, path)
	if !ok {
		return
	}
	removed := map[string]bool{}
	var from []string
	var refusal *nodeAnswer
	for i, a := range answers {
		switch {
		case a.err == nil && a.status == http.StatusOK:
			var out struct {
				Removed []string `json:"removed"`
			}
			json.Unmarshal(a.body, &out)
			for _, t := range out.Removed {
				removed[t] = true
			}
			from = append(from, a.node)
		case a.err == nil && a.status >= 400 && a.status < 500 && a.status != http.StatusNotFound && a.status != http.StatusTooManyRequests && refusal == nil:
			refusal = &answers[i]
		}
	}
	warnUnreachable(w, answers)
	if refusal != nil {
		// Said with what the other nodes did meanwhile: the deletes ran
		// on every node at once.
		if len(from) > 0 {
			refusal.body = appendDetail(refusal.body, fmt.Sprintf("; node(s) %s removed it meanwhile", strings.Join(from, ", ")))
		}
		forwardProblem(w, *refusal)
		return
	}
	if len(removed) == 0 {
		g.noSnapshot(w, tag, answers)
		return
	}
	list := make([]string, 0, len(removed))
	for t := range removed {
		list = append(list, t)
	}
	sort.Strings(list)
	writeJSON(w, http.StatusOK, map[string][]string{"removed": list})
}

// appendDetail adds to a problem document's detail.
func appendDetail(body []byte, more string) []byte {
	var p map[string]any
	if json.Unmarshal(body, &p) != nil {
		return append(body, more...)
	}
	d, _ := p["detail"].(string)
	p["detail"] = d + more
	out, _ := json.Marshal(p)
	return out
}

// noNodes answers a request no node could be asked about.
func noNodes(w http.ResponseWriter) {
	writeProblem(w, http.StatusServiceUnavailable, "unavailable", "no node daemon is known yet (discovery found none, or has not answered): retry")
}

// eachNode sends method path to every node for the caller; with no node
// known it answers 503 and false.
func (g *Gateway) eachNode(w http.ResponseWriter, r *http.Request, c caller, method, path string) ([]nodeAnswer, bool) {
	nodes := g.Nodes.All()
	if len(nodes) == 0 {
		noNodes(w)
		return nil, false
	}
	return fanOut(r.Context(), nodes, func(ctx context.Context, nc *controller.NodeClient) (int, []byte, error) {
		return callNode(ctx, nc, controller.TenantFor(c.namespace), method, path)
	}), true
}

// noSnapshot answers 404 for a tag no node holds for the caller, or 503
// when some node could not be asked.
func (g *Gateway) noSnapshot(w http.ResponseWriter, tag string, answers []nodeAnswer) {
	for _, a := range answers {
		if !answered(a) {
			writeProblem(w, http.StatusServiceUnavailable, "unavailable",
				fmt.Sprintf("snapshot %q: no node that answered holds it for this namespace, and node %s did not answer; retry", tag, a.node))
			return
		}
	}
	writeProblem(w, http.StatusNotFound, "not_found",
		fmt.Sprintf("no snapshot tagged %q on any node for this namespace (a branch of one of its sandboxes, one shared with it, or one of the nodes' operator)", tag))
}

// forwardProblem passes on a daemon's refusal, naming the node.
func forwardProblem(w http.ResponseWriter, a nodeAnswer) {
	var p problem
	if json.Unmarshal(a.body, &p) != nil || p.Code == "" {
		p = problem{Code: "unavailable", Detail: strings.TrimSpace(string(a.body))}
	}
	writeProblem(w, a.status, p.Code, fmt.Sprintf("node %s: %s", a.node, p.Detail))
}
