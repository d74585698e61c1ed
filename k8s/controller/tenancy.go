package controller

import (
	"slices"
	"sort"

	"github.com/forkd-dev/forkd/k8s/placement"
)

// operatorTenant is the node daemons' own tenant: that of their Unix
// socket and of the controller's admin token (deploy/gen-secrets.sh gives
// it none, which is this one). What it owns on a node, base images built
// there or pulled by the controller, every namespace may fork.
const operatorTenant = "default"

// TenantFor is the tenant a namespace acts as on the nodes
// (ActForHeader): its own name, except for a namespace named as the
// operator's tenant, which would own the operator's snapshots and is
// "k8s.default" instead (no namespace name has a '.').
func TenantFor(namespace string) string {
	if namespace == operatorTenant {
		return "k8s." + namespace
	}
	return namespace
}

// privateKey is the placement key of a tag a node holds for one tenant
// (its owner's, or shared with it); a tag alone is the key of one every
// namespace may fork. Tags have no '@' or '/'.
func privateKey(tenant, tag string) string { return "@" + tenant + "/" + tag }

// publicSnapshot says every namespace may fork s: the operator's (or from
// a daemon that reports no owner), or shared with every tenant.
func publicSnapshot(s apiSnapshot) bool {
	return s.Owner == "" || s.Owner == operatorTenant || slices.Contains(s.SharedWith, "*")
}

// visibleTo says tenant may fork s.
func visibleTo(s apiSnapshot, tenant string) bool {
	return publicSnapshot(s) || s.Owner == tenant || slices.Contains(s.SharedWith, tenant)
}

// occupiedKey is the placement key of every tag a node holds, whoever
// may fork it: a node holding it cannot pull another snapshot under it.
func occupiedKey(tag string) string { return "#" + tag }

// placementKeys are the keys a node holding snapshots is placed under:
// the tag for a public one, else one private key per tenant that may
// fork it; and occupiedKey of each; sorted.
func placementKeys(snapshots map[string]apiSnapshot) []string {
	keys := make([]string, 0, 2*len(snapshots))
	for tag, s := range snapshots {
		keys = append(keys, occupiedKey(tag))
		keys = forkKeys(keys, tag, s)
	}
	sort.Strings(keys)
	return keys
}

// forkKeys appends the keys a snapshot held as tag is forked under: the
// tag for a public one, else one private key per tenant that may fork
// it.
func forkKeys(keys []string, tag string, s apiSnapshot) []string {
	if publicSnapshot(s) {
		return append(keys, tag)
	}
	keys = append(keys, privateKey(s.Owner, tag))
	for _, t := range s.SharedWith {
		keys = append(keys, privateKey(t, tag))
	}
	return keys
}

// warmKeys are a node's pooled VMMs by placement key (placement.Node's
// Warm): each key a snapshot is forked under counts the VMMs pooled for
// it. The keys of a snapshot shared between tenants each count its whole
// pool, so forks under different keys may together be sent more than it
// holds before the next report: the extra ones start cold.
func warmKeys(snapshots map[string]apiSnapshot) map[string]int {
	warm := map[string]int{} // not nil: a report, even of no pools
	for tag, s := range snapshots {
		if s.Pooled <= 0 {
			continue
		}
		for _, k := range forkKeys(nil, tag, s) {
			warm[k] = s.Pooled
		}
	}
	return warm
}

// snapshotKeys are the placement keys of a Sandbox's snapshot: its
// namespace's private key (the one pulled under, when pullable), then
// the public tag.
func snapshotKeys(namespace, tag string) (snapshot string, also []string) {
	return privateKey(TenantFor(namespace), tag), []string{tag}
}

// snapshotRequest fills a placement request's keys for a Sandbox's
// snapshot (snapshotKeys, and occupiedKey: never pulled where the tag is
// held already).
func snapshotRequest(req *placement.Request, namespace, tag string) {
	req.Snapshot, req.Also = snapshotKeys(namespace, tag)
	req.Occupied = occupiedKey(tag)
}
