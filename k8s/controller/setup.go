// Package controller is forkd's Kubernetes controller: it keeps a view of
// the nodes' forkd daemons (NodeView, polling each daemon's REST API into
// a placement.Cluster), forks each Sandbox on the node placement picks
// (SandboxReconciler), keeps each SandboxWarmPool's unclaimed Sandboxes
// (WarmPoolReconciler), and binds each SandboxClaim to a Sandbox, taken
// from a pool or made from its template (ClaimReconciler). It talks to
// the daemons over their REST API (internal/api/openapi.yaml) with its own
// small JSON structs: this module does not import the daemon's.
package controller

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"
	"github.com/forkd-dev/forkd/k8s/placement"
)

// NewScheme returns a scheme with the core Kubernetes types and forkd's.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Options configure Setup.
type Options struct {
	// Discovery finds the node daemons (PodDiscovery in a cluster).
	Discovery Discovery
	// Token is the bearer token the daemons accept; HTTP the client for
	// them (its TLS configuration trusts their certificates).
	Token string
	HTTP  *http.Client
	// PollInterval, FailureThreshold: see NodeView.
	PollInterval     time.Duration
	FailureThreshold int
	// DefaultMemoryBytes: see SandboxReconciler.
	DefaultMemoryBytes int64
	// MaxConcurrentReconciles of the Sandbox controller (default 8): a
	// fork that pulls holds a worker for minutes.
	MaxConcurrentReconciles int
	// Events records events on Sandboxes and claims (nil: none); the
	// manager's GetEventRecorder("forkd-controller").
	Events EventRecorder
}

// Controllers are the parts Setup made.
type Controllers struct {
	Cluster *placement.Cluster
	Nodes   *NodeView
	// Daemons finds the node daemons without the NodeView, on any
	// replica (the cluster gateway's).
	Daemons   *AddressBook
	Sandboxes *SandboxReconciler
	Claims    *ClaimReconciler
	Pools     *WarmPoolReconciler
}

// Setup adds the node view and the three reconcilers to mgr.
func Setup(mgr ctrl.Manager, o Options) (*Controllers, error) {
	if o.Discovery == nil {
		return nil, fmt.Errorf("controller setup: no discovery of the node daemons")
	}
	log := ctrl.Log.WithName("forkd")
	cluster := placement.New()
	nodes := &NodeView{
		Cluster:          cluster,
		Discovery:        o.Discovery,
		Token:            o.Token,
		HTTP:             o.HTTP,
		Interval:         o.PollInterval,
		FailureThreshold: o.FailureThreshold,
		Log:              log.WithName("nodes"),
	}
	sbr := &SandboxReconciler{
		Client:             mgr.GetClient(),
		Reader:             mgr.GetAPIReader(),
		Cluster:            cluster,
		Nodes:              nodes,
		DefaultMemoryBytes: o.DefaultMemoryBytes,
		Events:             o.Events,
		Log:                log.WithName("sandbox"),
	}
	nodes.OnNodeUp = sbr.BindNode
	nodes.OnNodeLost = sbr.MarkNodeLost
	cr := &ClaimReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Preplacer: sbr, Events: o.Events, Log: log.WithName("claim")}
	pr := &WarmPoolReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Log: log.WithName("warmpool")}

	if err := mgr.Add(nodes); err != nil {
		return nil, err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1.Sandbox{}, IndexNodeName, NodeNameOf); err != nil {
		return nil, fmt.Errorf("controller setup: index Sandboxes by node: %w", err)
	}
	// Claims and pools read templates, which nothing watches: start that
	// informer with the cache, not on the first claim's read (which would
	// wait for it to sync, about a second of that claim's start).
	if _, err := mgr.GetCache().GetInformer(context.Background(), &v1.SandboxTemplate{}, cache.BlockUntilSynced(false)); err != nil {
		return nil, fmt.Errorf("controller setup: template informer: %w", err)
	}
	workers := o.MaxConcurrentReconciles
	if workers <= 0 {
		workers = 8
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&v1.Sandbox{}).
		Named("sandbox").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(sbr); err != nil {
		return nil, err
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&v1.SandboxClaim{}).
		Owns(&v1.Sandbox{}).
		Named("sandboxclaim").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(cr); err != nil {
		return nil, err
	}
	// A claim taking a pool's Sandbox changes its controller: Owns wakes
	// both the claim and the pool, which forks a replacement. A template
	// changed (or created) wakes the pools forking it, which roll it out.
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&v1.SandboxWarmPool{}).
		Owns(&v1.Sandbox{}).
		Watches(&v1.SandboxTemplate{}, handler.EnqueueRequestsFromMapFunc(pr.poolsOfTemplate)).
		Named("sandboxwarmpool").
		Complete(pr); err != nil {
		return nil, err
	}
	book := &AddressBook{Discovery: o.Discovery, Token: o.Token, HTTP: o.HTTP}
	return &Controllers{Cluster: cluster, Nodes: nodes, Daemons: book, Sandboxes: sbr, Claims: cr, Pools: pr}, nil
}
