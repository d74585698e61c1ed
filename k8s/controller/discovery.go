package controller

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeEndpoint is one node's forkd daemon as discovery finds it.
type NodeEndpoint struct {
	// Node is the Kubernetes node name: what Sandbox status.nodeName says.
	Node string
	// URL is the daemon's API root (https://10.0.0.5:7070).
	URL string
	// MemoryBytes is the memory placement may reserve for sandboxes there
	// and DiskFreeBytes the room for pulled snapshots, as discovery sees
	// them (PodDiscovery: the Node's allocatable memory times
	// MemoryShare, and its ephemeral storage). A daemon that reports its
	// capacity (GET /v1/info to an admin) refines them: placement gets the
	// smaller of MemoryBytes and the daemon's guest memory limit, the
	// daemon's free disk, and what it has committed (see
	// placement.Node.CommittedBytes).
	MemoryBytes   int64
	DiskFreeBytes int64
	// MemoryPinned and DiskPinned say the operator set the figure (the
	// daemon pod's annotations): it is used as is, whatever the daemon
	// reports.
	MemoryPinned, DiskPinned bool
}

// Discovery finds the node daemons. PodDiscovery finds the pods of the
// forkd DaemonSet; tests give a StaticDiscovery.
type Discovery interface {
	Discover(ctx context.Context) ([]NodeEndpoint, error)
}

// StaticDiscovery is a fixed list of daemons.
type StaticDiscovery []NodeEndpoint

// Discover returns the list.
func (s StaticDiscovery) Discover(context.Context) ([]NodeEndpoint, error) {
	return append([]NodeEndpoint(nil), s...), nil
}

// Annotations a daemon pod may carry to override what PodDiscovery derives
// from its Node.
const (
	AnnotationMemoryBytes   = "forkd.dev/memory-bytes"
	AnnotationDiskFreeBytes = "forkd.dev/disk-free-bytes"
)

// PodDiscovery finds the daemons as the running pods of the forkd
// DaemonSet: those in Namespace matching Selector, at their pod IP and
// Port.
type PodDiscovery struct {
	Client    client.Reader
	Namespace string
	Selector  labels.Selector
	Port      int
	// Scheme is https (the daemon needs TLS off loopback) or http (a
	// daemon run with --insecure-no-tls-or-auth-i-know).
	Scheme string
	// MemoryShare is the part of a Node's allocatable memory placement
	// may reserve (1: all of it; forkd shares pages between forks, so
	// more than 1 overcommits knowingly). 0 means 1.
	MemoryShare float64
}

// Discover lists the daemon pods. A node with several (a rolling update)
// counts once, with its ready pod, else its newest.
func (d *PodDiscovery) Discover(ctx context.Context) ([]NodeEndpoint, error) {
	var pods corev1.PodList
	if err := d.Client.List(ctx, &pods, client.InNamespace(d.Namespace), client.MatchingLabelsSelector{Selector: d.Selector}); err != nil {
		return nil, fmt.Errorf("list forkd daemon pods in %s (%s): %w", d.Namespace, d.Selector, err)
	}
	byNode := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.Status.PodIP == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		if cur := byNode[p.Spec.NodeName]; cur == nil || preferPod(p, cur) {
			byNode[p.Spec.NodeName] = p
		}
	}
	scheme := d.Scheme
	if scheme == "" {
		scheme = "https"
	}
	share := d.MemoryShare
	if share <= 0 {
		share = 1
	}
	out := make([]NodeEndpoint, 0, len(byNode))
	for name, p := range byNode {
		ep := NodeEndpoint{
			Node: name,
			URL:  scheme + "://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(d.Port)),
		}
		var n corev1.Node
		if err := d.Client.Get(ctx, types.NamespacedName{Name: name}, &n); err == nil {
			if q, ok := n.Status.Allocatable[corev1.ResourceMemory]; ok {
				ep.MemoryBytes = int64(float64(q.Value()) * share)
			}
			if q, ok := n.Status.Allocatable[corev1.ResourceEphemeralStorage]; ok {
				ep.DiskFreeBytes = q.Value()
			}
		}
		if v, err := strconv.ParseInt(p.Annotations[AnnotationMemoryBytes], 10, 64); err == nil && v >= 0 {
			ep.MemoryBytes, ep.MemoryPinned = v, true
		}
		if v, err := strconv.ParseInt(p.Annotations[AnnotationDiskFreeBytes], 10, 64); err == nil && v >= 0 {
			ep.DiskFreeBytes, ep.DiskPinned = v, true
		}
		out = append(out, ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// preferPod says p is a better daemon pod for its node than cur: ready
// over not ready, then the newer.
func preferPod(p, cur *corev1.Pod) bool {
	pr, cr := podReady(p), podReady(cur)
	if pr != cr {
		return pr
	}
	return cur.CreationTimestamp.Before(&p.CreationTimestamp)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
