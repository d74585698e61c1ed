// Package gateway serves forkd's REST API for a whole cluster, so code
// written against one host (the SDKs, the CLI with --host, curl) works
// against Kubernetes unchanged. A fork becomes Sandbox objects, which the
// controller places and forks like any other; every request about one
// sandbox (exec, files, run_code, ports, PTYs, WebSockets) is proxied to
// the daemon on its node, with the controller's node token in place of
// the caller's.
//
// Callers hold the gateway's own tokens (a file in forkd's tokens.json
// format, SHA-256 only): a token's tenant is the Kubernetes namespace its
// sandboxes live in, so RBAC on namespaces and the API agree on who sees
// what.
package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkd-dev/forkd/k8s/controller"
)

// Nodes finds the API clients of the nodes' daemons
// (controller.AddressBook).
type Nodes interface {
	Client(node string) (*controller.NodeClient, bool)
	// All returns a client for every node's daemon, by node name.
	All() map[string]*controller.NodeClient
}

// Gateway is the cluster-wide REST API.
type Gateway struct {
	// Client reads Sandboxes through a cache indexed by IndexSandboxID
	// (see AddIndexes) and creates and deletes them.
	Client client.Client
	Nodes  Nodes
	Tokens *Tokens
	// Preplacer, when set, binds each Sandbox to a node before it is
	// created (controller.SandboxReconciler.Preplace): a status write
	// fewer before its fork.
	Preplacer controller.Preplacer
	// DefaultNamespace holds the sandboxes of tokens without a tenant
	// (admins).
	DefaultNamespace string
	// ReadyTimeout bounds how long a fork waits for its sandboxes to run
	// (default 5 minutes); MaxFork caps a fork's count (default 100).
	ReadyTimeout time.Duration
	MaxFork      int
	Version      string
	Log          logr.Logger
}

// Handler routes the API.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /v1/version", g.authed(reader, g.version))
	mux.HandleFunc("GET /v1/info", g.authed(reader, g.info))
	mux.HandleFunc("POST /v1/sandboxes", g.authed(user, g.fork))
	mux.HandleFunc("GET /v1/sandboxes", g.authed(reader, g.list))
	mux.HandleFunc("POST /v1/sandboxes/kill", g.authed(user, g.kill))
	mux.HandleFunc("GET /v1/sandboxes/{id}", g.authed(reader, g.get))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", g.authed(user, g.delete))
	mux.HandleFunc("/v1/sandboxes/{id}/", g.authed(user, g.proxy))
	mux.HandleFunc("PATCH /v1/sandboxes/{id}", g.authed(user, g.proxy))
	mux.HandleFunc("GET /v1/snapshots", g.authed(reader, g.listSnapshots))
	mux.HandleFunc("GET /v1/snapshots/{tag}", g.authed(reader, g.getSnapshot))
	mux.HandleFunc("DELETE /v1/snapshots/{tag}", g.authed(user, g.deleteSnapshot))
	mux.HandleFunc("/", g.authed(reader, func(w http.ResponseWriter, r *http.Request, _ caller) {
		writeProblem(w, http.StatusNotImplemented, "not_implemented",
			fmt.Sprintf("%s %s is not served by the cluster gateway: it serves forks, sandboxes, everything under /v1/sandboxes/{id}/ (branch included) and the snapshots the namespace sees (list, get, delete); build, push and pull base snapshots on the nodes (forkd snapshot, forkd push) and name them in a SandboxTemplate", r.Method, r.URL.Path))
	}))
	return mux
}

// Features the gateway offers (GET /v1/info); "cluster" tells a client it
// talks to a gateway, not one daemon.
var features = []string{"cluster", "exec", "exec.websocket", "files", "fork", "idempotency", "lifetimes", "network.egress", "ports", "processes", "pty", "run_code"}

func (g *Gateway) version(w http.ResponseWriter, _ *http.Request, _ caller) {
	writeJSON(w, http.StatusOK, map[string]string{"version": g.Version, "api_version": "v1"})
}

func (g *Gateway) info(w http.ResponseWriter, _ *http.Request, c caller) {
	writeJSON(w, http.StatusOK, map[string]any{
		"version": g.Version, "api_version": "v1", "vmm": "cluster", "vmm_version": "", "accel": "",
		"features": features,
		"limits": map[string]any{
			"max_fork_count": g.maxFork(), "max_sandboxes": 0, "max_timeout_s": 0,
			"default_timeout_s": 0, "dead_retention_s": 0, "pool_size": 0,
		},
		"caller": map[string]string{"tenant": c.namespace, "role": string(c.role)},
	})
}

func (g *Gateway) maxFork() int {
	if g.MaxFork > 0 {
		return g.MaxFork
	}
	return 100
}

func (g *Gateway) readyTimeout() time.Duration {
	if g.ReadyTimeout > 0 {
		return g.ReadyTimeout
	}
	return 5 * time.Minute
}

// caller is who a request's token names.
type caller struct {
	name      string
	role      Role
	namespace string
}

// need is the least role a route takes.
type need int

const (
	reader need = iota
	user
)

// authed checks the bearer token and the role a route needs.
func (g *Gateway) authed(n need, h func(http.ResponseWriter, *http.Request, caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			writeProblem(w, http.StatusUnauthorized, "unauthenticated", "no bearer token: send Authorization: Bearer TOKEN (a token of the gateway's token file)")
			return
		}
		e, ok := g.Tokens.Lookup(tok)
		if !ok {
			writeProblem(w, http.StatusUnauthorized, "unauthenticated", "the bearer token is not one of the gateway's")
			return
		}
		if n == user && e.Role == RoleReader {
			writeProblem(w, http.StatusForbidden, "permission_denied",
				fmt.Sprintf("token %q (read-only) may not call %s %s: it needs the user or admin role", e.Name, r.Method, r.URL.Path))
			return
		}
		ns := e.Tenant
		if ns == "" {
			ns = g.DefaultNamespace
		}
		h(w, r, caller{name: e.Name, role: e.Role, namespace: ns})
	}
}

// problem is forkd's RFC 9457 problem document.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "2")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(problem{
		Type: "https://forkd.dev/problems/" + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// detached is a context for clean-up after the request ended.
func detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}
