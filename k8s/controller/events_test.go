package controller

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// takeEvents drains the recorded events.
func (e *testEnv) takeEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// wantEvents checks that each of want is the start of one recorded event,
// in order.
func wantEvents(t *testing.T, got []string, want ...string) {
	t.Helper()
	i := 0
	for _, g := range got {
		if i < len(want) && strings.HasPrefix(g, want[i]) {
			i++
		}
	}
	if i < len(want) {
		t.Fatalf("events %q: want, in order, events starting %q", got, want)
	}
}

// TestEventsTellTheStory: a claim's Sandbox records where it was placed,
// its fork and its loss; the claim, the Sandbox it created and its
// replacement.
func TestEventsTellTheStory(t *testing.T) {
	e := newTestEnv(t,
		nodeSpec{name: "n1", memory: 8 * gib, snapshots: map[string]int{"py": 512}},
		nodeSpec{name: "n2", memory: 4 * gib, snapshots: map[string]int{"py": 512}})
	e.poll()
	e.createTemplate("py", "py")
	e.createClaim("job", "py")
	e.reconcileClaim("job")
	e.reconcile("job")
	wantEvents(t, e.takeEvents(),
		"Normal Created created Sandbox job from SandboxTemplate py",
		"Normal Pinned node n1",
		"Normal Forked sandbox ")

	e.standIn["n1"].setDown(true)
	e.poll()
	e.poll()
	e.reconcileClaim("job")
	wantEvents(t, e.takeEvents(),
		"Warning NodeLost node n1 stopped reporting",
		"Warning Replacing Sandbox job was lost with node n1",
		"Normal Created created Sandbox job-r1")

	// No room anywhere: a warning, each time placement finds none.
	sb := newSandbox("big", "py")
	big := resource.MustParse("64Gi")
	sb.Spec.Resources.Memory = &big
	e.create(sb)
	e.reconcile("big")
	wantEvents(t, e.takeEvents(), "Warning NoCapacity ")
}
