package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/controller"
)

// Labels on the Sandboxes the gateway creates.
const (
	// LabelFork groups the Sandboxes of one fork request.
	LabelFork = "forkd.dev/gateway-fork"
	// AnnotationMetadata carries a fork's metadata (a JSON object) to the
	// controller, which forks with it; listings filter on it.
	AnnotationMetadata = controller.AnnotationForkMetadata
)

// forkRequest is the part of forkd's ForkRequest the gateway serves.
type forkRequest struct {
	Tag                string            `json:"tag"`
	Count              int               `json:"count"`
	TimeoutSeconds     *int64            `json:"timeout_s,omitempty"`
	IdleTimeoutSeconds int64             `json:"idle_timeout_s,omitempty"`
	Network            *networkPolicy    `json:"network,omitempty"`
	CPUs               float64           `json:"cpus,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
}

type networkPolicy struct {
	Mode           string   `json:"mode"`
	Allow          []string `json:"allow,omitempty"`
	MaxConnections int32    `json:"max_connections,omitempty"`
	RateMbit       int32    `json:"rate_mbit,omitempty"`
}

// decodeBody reads a JSON body of at most 1 MiB, refusing unknown fields
// with the field named.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %v (the cluster gateway takes tag, count, timeout_s, idle_timeout_s, metadata, network and cpus)", err)
	}
	return nil
}

// fork creates count Sandboxes, waits until they run, and answers as a
// daemon does. With an Idempotency-Key their names derive from it, so a
// retry finds the same objects instead of forking again. A fork that
// cannot complete deletes what it created.
func (g *Gateway) fork(w http.ResponseWriter, r *http.Request, c caller) {
	start := time.Now()
	var req forkRequest
	if err := decodeBody(r, &req); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	if req.Count == 0 {
		req.Count = 1
	}
	switch {
	case req.Tag == "":
		writeProblem(w, http.StatusBadRequest, "invalid_argument", "tag is required: the snapshot tag to fork")
		return
	case req.Count < 0 || req.Count > g.maxFork():
		writeProblem(w, http.StatusBadRequest, "invalid_argument", fmt.Sprintf("count %d: want 1 to %d", req.Count, g.maxFork()))
		return
	}
	if err := checkMetadata(req.Metadata); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	group := forkGroup(c.namespace, r.Header.Get("Idempotency-Key"))
	var names []string
	for i := range req.Count {
		sb := sandboxFor(c.namespace, group, i, req)
		created := controller.Preplace(g.Preplacer, sb)
		err := g.Client.Create(r.Context(), sb)
		created(err)
		if apierrors.IsAlreadyExists(err) && r.Header.Get("Idempotency-Key") != "" {
			err = nil // a retry: the first request's object
		}
		if err != nil {
			g.undo(names)
			writeKubeProblem(w, fmt.Sprintf("create Sandbox %s/%s", c.namespace, sb.Name), err)
			return
		}
		names = append(names, c.namespace+"/"+sb.Name)
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.readyTimeout())
	defer cancel()
	var out []json.RawMessage
	for _, nn := range names {
		raw, status, code, err := g.waitRunning(ctx, c.namespace, nn[len(c.namespace)+1:])
		if err != nil {
			g.undo(names)
			writeProblem(w, status, code, fmt.Sprintf("fork of %s (%d sandboxes) undone: %v", req.Tag, req.Count, err))
			return
		}
		out = append(out, raw)
	}
	writeJSON(w, http.StatusCreated, map[string]any{"sandboxes": out, "total_ms": float64(time.Since(start).Microseconds()) / 1000})
}

// forkGroup names a fork's Sandboxes: gw-HASH of the tenant and key, or
// random without a key.
func forkGroup(namespace, key string) string {
	if key == "" {
		var b [6]byte
		rand.Read(b[:])
		return "gw-" + hex.EncodeToString(b[:])
	}
	h := sha256.Sum256([]byte(namespace + "\x00" + key))
	return "gw-" + hex.EncodeToString(h[:6])
}

// sandboxFor is the i-th Sandbox of a fork.
func sandboxFor(namespace, group string, i int, req forkRequest) *v1.Sandbox {
	sb := &v1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: group + "-" + strconv.Itoa(i),
			Labels: map[string]string{LabelFork: group},
			// So the controller has no write to make for it.
			Finalizers: []string{controller.Finalizer},
		},
	}
	sb.Spec.Snapshot.Tag = req.Tag
	if len(req.Metadata) > 0 {
		b, _ := json.Marshal(req.Metadata)
		sb.Annotations = map[string]string{AnnotationMetadata: string(b)}
	}
	// Retained once ended, so a dead sandbox stays listed (as on a
	// daemon) until killed.
	lc := &v1.Lifecycle{ShutdownPolicy: v1.ShutdownPolicyRetain, TimeoutSeconds: req.TimeoutSeconds}
	if req.IdleTimeoutSeconds > 0 {
		lc.IdleTimeoutSeconds = &req.IdleTimeoutSeconds
	}
	sb.Spec.Lifecycle = lc
	if n := req.Network; n != nil {
		sb.Spec.Network = &v1.NetworkPolicy{Mode: v1.NetworkMode(n.Mode), Allow: n.Allow, MaxConnections: n.MaxConnections, RateMbit: n.RateMbit}
	}
	if req.CPUs > 0 {
		q := resource.NewMilliQuantity(int64(req.CPUs*1000), resource.DecimalSI)
		sb.Spec.Resources.CPU = q
	}
	return sb
}

// waitRunning waits until a Sandbox runs and returns its daemon's
// description; a Sandbox that ended, was lost or found no room fails with
// its condition's message.
func (g *Gateway) waitRunning(ctx context.Context, namespace, name string) (json.RawMessage, int, string, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var sb v1.Sandbox
		err := g.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sb)
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			return nil, http.StatusServiceUnavailable, "unavailable", err
		case err == nil && sb.Status.Phase == v1.SandboxRunning && sb.Status.SandboxID != "":
			raw, err := g.describe(ctx, &sb)
			if err != nil {
				return nil, http.StatusBadGateway, "unavailable", err
			}
			return raw, 0, "", nil
		case err == nil && (sb.Status.Phase == v1.SandboxLost || sb.Status.Phase == v1.SandboxEnded):
			return nil, http.StatusServiceUnavailable, "unavailable", fmt.Errorf("Sandbox %s is %s: %s", name, sb.Status.Phase, readyMessage(&sb))
		case err == nil && snapshotNotFound(&sb):
			// As a daemon answers a fork of a tag it does not hold.
			return nil, http.StatusNotFound, "not_found", fmt.Errorf("Sandbox %s: %s", name, readyMessage(&sb))
		}
		select {
		case <-ctx.Done():
			status, code := http.StatusGatewayTimeout, "deadline_exceeded"
			msg := "not placed yet"
			if err == nil {
				if cond := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionPlaced); cond != nil && cond.Reason == v1.ReasonNoCapacity {
					status, code = http.StatusTooManyRequests, "resource_exhausted"
				}
				msg = readyMessage(&sb)
			}
			return nil, status, code, fmt.Errorf("Sandbox %s did not run within %s: %s", name, g.readyTimeout(), msg)
		case <-tick.C:
		}
	}
}

// snapshotNotFound says the controller found no snapshot to fork for
// the Sandbox: none held for its namespace anywhere, or refused by the
// node chosen.
func snapshotNotFound(sb *v1.Sandbox) bool {
	for _, t := range []string{v1.ConditionReady, v1.ConditionPlaced} {
		if c := meta.FindStatusCondition(sb.Status.Conditions, t); c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonSnapshotNotFound {
			return true
		}
	}
	return false
}

// readyMessage is why a Sandbox is where it is, from its conditions.
func readyMessage(sb *v1.Sandbox) string {
	for _, t := range []string{v1.ConditionReady, v1.ConditionPlaced} {
		if c := meta.FindStatusCondition(sb.Status.Conditions, t); c != nil && c.Message != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return "phase " + string(sb.Status.Phase)
}

// undo deletes a failed fork's Sandboxes (their finalizers delete the
// microVMs forked so far).
func (g *Gateway) undo(names []string) {
	ctx, cancel := detached()
	defer cancel()
	for _, nn := range names {
		ns, name, _ := cut(nn)
		sb := &v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := g.Client.Delete(ctx, sb); client.IgnoreNotFound(err) != nil {
			g.Log.Error(err, "undo a failed fork: delete Sandbox", "namespace", ns, "name", name)
		}
	}
}

func cut(nn string) (ns, name string, ok bool) {
	for i := range nn {
		if nn[i] == '/' {
			return nn[:i], nn[i+1:], true
		}
	}
	return "", nn, false
}

// describe asks the sandbox's node for its description (GET
// /v1/sandboxes/{id}); a sandbox whose node is gone is described from its
// object.
func (g *Gateway) describe(ctx context.Context, sb *v1.Sandbox) (json.RawMessage, error) {
	nc, ok := g.Nodes.Client(sb.Status.NodeName)
	if !ok || !live(sb) {
		return json.Marshal(fromObject(sb))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(nc.Base, "/")+"/v1/sandboxes/"+url.PathEscape(sb.Status.SandboxID), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+nc.Token)
	resp, err := httpClient(nc).Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", sb.Status.NodeName, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", sb.Status.NodeName, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return json.Marshal(fromObject(sb))
	}
	if resp.StatusCode != http.StatusOK || !json.Valid(b) {
		return nil, fmt.Errorf("node %s: GET /v1/sandboxes/%s: %s", sb.Status.NodeName, sb.Status.SandboxID, resp.Status)
	}
	return b, nil
}

func live(sb *v1.Sandbox) bool {
	return sb.Status.Phase != v1.SandboxLost && sb.Status.Phase != v1.SandboxEnded
}

// apiSandbox is forkd's Sandbox schema as the gateway fills it from an
// object, for listings and for sandboxes whose node is gone.
type apiSandbox struct {
	ID           string            `json:"id"`
	Tag          string            `json:"tag"`
	State        string            `json:"state"`
	Created      time.Time         `json:"created"`
	ReadyMs      float64           `json:"ready_ms"`
	Pooled       bool              `json:"pooled"`
	LastActivity time.Time         `json:"last_activity"`
	DeadReason   string            `json:"dead_reason,omitempty"`
	Tenant       string            `json:"tenant,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
}

func fromObject(sb *v1.Sandbox) apiSandbox {
	s := apiSandbox{
		ID: sb.Status.SandboxID, Tag: sb.Spec.Snapshot.Tag, Created: sb.CreationTimestamp.UTC(),
		LastActivity: sb.CreationTimestamp.UTC(), Tenant: sb.Namespace, Metadata: metadataOf(sb),
	}
	switch sb.Status.Phase {
	case v1.SandboxRunning:
		s.State = "running"
	case v1.SandboxLost, v1.SandboxEnded:
		s.State, s.DeadReason = "dead", readyMessage(sb)
	default:
		s.State = "starting"
	}
	return s
}

// find returns the Sandbox of a forkd id in a namespace.
func (g *Gateway) find(ctx context.Context, namespace, id string) (*v1.Sandbox, error) {
	var l v1.SandboxList
	if err := g.Client.List(ctx, &l, client.InNamespace(namespace), client.MatchingFields{IndexSandboxID: id}); err != nil {
		return nil, err
	}
	if len(l.Items) == 0 {
		return nil, errNoSandbox
	}
	return &l.Items[0], nil
}

var errNoSandbox = errors.New("no sandbox")

func (g *Gateway) notFound(w http.ResponseWriter, id string, err error) {
	if errors.Is(err, errNoSandbox) {
		writeProblem(w, http.StatusNotFound, "not_found", fmt.Sprintf("no sandbox %q in this token's namespace", id))
		return
	}
	writeKubeProblem(w, "find sandbox "+id, err)
}

// get describes one sandbox.
func (g *Gateway) get(w http.ResponseWriter, r *http.Request, c caller) {
	id := r.PathValue("id")
	sb, err := g.find(r.Context(), c.namespace, id)
	if err != nil {
		g.notFound(w, id, err)
		return
	}
	raw, err := g.describe(r.Context(), sb)
	if err != nil {
		writeProblem(w, http.StatusBadGateway, "unavailable", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, raw)
}

// list lists the namespace's sandboxes (every Sandbox with an id, the
// gateway's and the claims' alike), oldest first, in one page.
func (g *Gateway) list(w http.ResponseWriter, r *http.Request, c caller) {
	var l v1.SandboxList
	if err := g.Client.List(r.Context(), &l, client.InNamespace(c.namespace)); err != nil {
		writeKubeProblem(w, "list Sandboxes", err)
		return
	}
	items := []apiSandbox{}
	q := r.URL.Query()
	for i := range l.Items {
		s := fromObject(&l.Items[i])
		if s.ID == "" || q.Get("tag") != "" && s.Tag != q.Get("tag") || q.Get("state") != "" && s.State != q.Get("state") || !hasLabels(s.Metadata, q["label"]) {
			continue
		}
		items = append(items, s)
	}
	sort.Slice(items, func(i, j int) bool {
		if !items[i].Created.Equal(items[j].Created) {
			return items[i].Created.Before(items[j].Created)
		}
		return items[i].ID < items[j].ID
	})
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// delete deletes a sandbox's object; its finalizer deletes the microVM.
func (g *Gateway) delete(w http.ResponseWriter, r *http.Request, c caller) {
	id := r.PathValue("id")
	sb, err := g.find(r.Context(), c.namespace, id)
	if err != nil {
		g.notFound(w, id, err)
		return
	}
	if err := g.Client.Delete(r.Context(), sb); client.IgnoreNotFound(err) != nil {
		writeKubeProblem(w, "delete Sandbox "+sb.Name, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// kill deletes the sandboxes named, or all of the namespace's.
func (g *Gateway) kill(w http.ResponseWriter, r *http.Request, c caller) {
	var req struct {
		IDs []string `json:"ids"`
		All bool     `json:"all"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	if req.All == (len(req.IDs) > 0) {
		writeProblem(w, http.StatusBadRequest, "invalid_argument", "give exactly one of ids and all")
		return
	}
	var targets []v1.Sandbox
	if req.All {
		var l v1.SandboxList
		if err := g.Client.List(r.Context(), &l, client.InNamespace(c.namespace)); err != nil {
			writeKubeProblem(w, "list Sandboxes", err)
			return
		}
		targets = l.Items
	} else {
		for _, id := range req.IDs {
			sb, err := g.find(r.Context(), c.namespace, id)
			if errors.Is(err, errNoSandbox) {
				continue // as a daemon: unknown ids are not killed
			}
			if err != nil {
				writeKubeProblem(w, "find sandbox "+id, err)
				return
			}
			targets = append(targets, *sb)
		}
	}
	killed := []string{}
	for i := range targets {
		sb := &targets[i]
		if sb.Status.SandboxID == "" {
			continue
		}
		if err := g.Client.Delete(r.Context(), sb); client.IgnoreNotFound(err) != nil {
			writeKubeProblem(w, "delete Sandbox "+sb.Name, err)
			return
		}
		killed = append(killed, sb.Status.SandboxID)
	}
	sort.Strings(killed)
	writeJSON(w, http.StatusOK, map[string]any{"killed": killed})
}

// writeKubeProblem answers for an apiserver error.
func writeKubeProblem(w http.ResponseWriter, what string, err error) {
	switch {
	case apierrors.IsForbidden(err):
		writeProblem(w, http.StatusForbidden, "permission_denied", what+": "+err.Error())
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		writeProblem(w, http.StatusBadRequest, "invalid_argument", what+": "+err.Error())
	case apierrors.IsNotFound(err):
		writeProblem(w, http.StatusNotFound, "not_found", what+": "+err.Error())
	default:
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", what+": "+err.Error())
	}
}

// checkMetadata bounds a fork's metadata: 64 entries, keys of 1 to 63
// bytes, values of at most 256.
func checkMetadata(m map[string]string) error {
	if len(m) > 64 {
		return fmt.Errorf("metadata has %d entries: at most 64", len(m))
	}
	for k, v := range m {
		if k == "" || len(k) > 63 || len(v) > 256 {
			return fmt.Errorf("metadata %q: keys take 1 to 63 bytes, values at most 256", k)
		}
	}
	return nil
}

// metadataOf reads a Sandbox's fork metadata (nil when absent or not an
// object of strings).
func metadataOf(sb *v1.Sandbox) map[string]string {
	var m map[string]string
	if a := sb.Annotations[AnnotationMetadata]; a != "" && json.Unmarshal([]byte(a), &m) != nil {
		return nil
	}
	return m
}

// hasLabels says m has every KEY=VALUE of ?label= (as a daemon filters).
func hasLabels(m map[string]string, want []string) bool {
	for _, kv := range want {
		k, v, _ := strings.Cut(kv, "=")
		if got, ok := m[k]; !ok || got != v {
			return false
		}
	}
	return true
}
