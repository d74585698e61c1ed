package loadtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/forkd-dev/forkd/k8s/api/v1alpha1"

	"github.com/forkd-dev/forkd/k8s/controller"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// blueprint is a snapshot tag the nodes hold, 256 MiB reserved, no image:
// placement must find a holder.
func blueprint(tag string) v1.SandboxBlueprint {
	mem := resource.NewQuantity(sandboxMem, resource.BinarySI)
	return v1.SandboxBlueprint{Snapshot: v1.SnapshotRef{Tag: tag}, Resources: v1.Resources{Memory: mem}}
}

// createTemplate creates the template of a tag and waits until the
// controller's cache has it: a claim whose template the cache lacks waits
// 30 s (TemplateNotFound), which would be measured as the claim's latency.
func createTemplate(t *testing.T, ctx context.Context, c client.Client, cache client.Reader, ns, tag string) {
	t.Helper()
	tmpl := &v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "t-" + tag},
		Spec: v1.SandboxTemplateSpec{SandboxBlueprint: blueprint(tag)}}
	if err := c.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "template "+tmpl.Name+" in the controller's cache", func() bool {
		return cache.Get(ctx, client.ObjectKeyFromObject(tmpl), &v1.SandboxTemplate{}) == nil
	})
}

func claim(ns, name, tag string) *v1.SandboxClaim {
	return &v1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.SandboxClaimSpec{TemplateRef: v1.LocalRef{Name: "t-" + tag}}}
}

func sandbox(ns, name, tag string) *v1.Sandbox {
	return &v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.SandboxSpec{SandboxBlueprint: blueprint(tag)}}
}

// preloadObjects writes s.objects Sandboxes as the controller leaves them
// Running (finalizer, status), spread over the nodes on snapshots they
// hold, and tells the stand-in they run there.
func preloadObjects(t *testing.T, ctx context.Context, c client.Client, s scale, nodes []StandInNode, stand *FleetStandIn) {
	t.Helper()
	parallel(t, s.objects, func(i int) error {
		n := nodes[i%len(nodes)]
		tag := n.Snapshots[(i/len(nodes))%len(n.Snapshots)]
		sb := sandbox("preload", fmt.Sprintf("p-%06d", i), tag)
		sb.Finalizers = []string{controller.Finalizer}
		if err := c.Create(ctx, sb); err != nil {
			return err
		}
		id := fmt.Sprintf("pre-%06d", i)
		sb.Status = v1.SandboxStatus{Phase: v1.SandboxRunning, NodeName: n.Name, SandboxID: id,
			Endpoint: "http://stand-in/n/" + n.Name + "/v1/sandboxes/" + id}
		meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionReady,
			Status: metav1.ConditionTrue, Reason: v1.ReasonForked, Message: "preloaded by the load test"})
		if err := c.Status().Update(ctx, sb); err != nil {
			return err
		}
		stand.AddRunning(n.Name, id, tag, map[string]string{controller.MetaUID: string(sb.UID)})
		return nil
	})
}

// bindBare reserves the rest of the view directly in placement, evenly
// over the nodes, and has the stand-in count those sandboxes as running.
func bindBare(t *testing.T, ctrls *controller.Controllers, s scale, nodes []StandInNode, stand *FleetStandIn) int {
	t.Helper()
	perNode := s.view / s.nodes
	bound := 0
	for i, n := range nodes {
		objs := s.objects / s.nodes
		if i < s.objects%s.nodes {
			objs++
		}
		for j := range max(0, perNode-objs) {
			if err := ctrls.Cluster.Bind(fmt.Sprintf("bare/%s-%d", n.Name, j), n.Name, sandboxMem); err != nil {
				t.Fatal(err)
			}
			bound++
		}
		stand.AddPreloaded(n.Name, max(0, perNode-objs))
	}
	return bound
}
