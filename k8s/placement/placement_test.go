package placement

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

const gib = 1 << 30

func mustPlace(t *testing.T, c *Cluster, req Request) Decision {
	t.Helper()
	d, err := c.Place(req)
	if err != nil {
		t.Fatalf("place %+v: %v", req, err)
	}
	return d
}

func TestPlacePrefersHolderWithMostFreeMemory(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "a", Ready: true, MemoryBytes: 8 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "b", Ready: true, MemoryBytes: 16 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "c", Ready: true, MemoryBytes: 64 * gib}) // most memory, no snapshot
	if d := mustPlace(t, c, Request{Key: "s1", Snapshot: "py", MemoryBytes: 4 * gib, Pullable: true}); d != (Decision{Node: "b"}) {
		t.Fatalf("first sandbox placed %+v, want on b, the holder with most free memory", d)
	}
	// b: 12 GiB free, a: 8: b again, then they tie at 8 and the name decides.
	if d := mustPlace(t, c, Request{Key: "s2", Snapshot: "py", MemoryBytes: 4 * gib}); d.Node != "b" {
		t.Fatalf("second sandbox on %q, want b", d.Node)
	}
	if d := mustPlace(t, c, Request{Key: "s3", Snapshot: "py", MemoryBytes: 4 * gib}); d.Node != "a" {
		t.Fatalf("third sandbox on %q, want a (ties with b at 8 GiB free, sorts first)", d.Node)
	}
}

// TestPlacePrefersAHolderWithAWarmVMM: among holders with room, one with
// a pooled VMM left for the snapshot wins over more free memory, until
// its placements use the VMMs it reported; a new report restores them; a
// warm holder without room is passed over.
func TestPlacePrefersAHolderWithAWarmVMM(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "big", Ready: true, MemoryBytes: 64 * gib, Snapshots: []string{"py"}})
	warm := Node{Name: "warm", Ready: true, MemoryBytes: 9 * gib, Snapshots: []string{"py", "js"}, Warm: map[string]int{"py": 2}}
	c.SetNode(warm)
	var got []string
	for i := range 3 {
		got = append(got, mustPlace(t, c, Request{Key: fmt.Sprint("s", i), Snapshot: "py", MemoryBytes: 2 * gib}).Node)
	}
	if !slices.Equal(got, []string{"warm", "warm", "big"}) {
		t.Fatalf("placed on %q, want warm's two pooled VMMs used first, then the most free memory", got)
	}
	if d := mustPlace(t, c, Request{Key: "j", Snapshot: "js", MemoryBytes: 2 * gib}); d.Node != "warm" {
		t.Fatalf("js on %q, want warm (its only holder)", d.Node)
	}
	noNews := warm
	noNews.Warm = nil // a report without the pools (a lookup's): the count stays
	c.SetNode(noNews)
	if d := mustPlace(t, c, Request{Key: "s9", Snapshot: "py", MemoryBytes: gib}); d.Node != "big" {
		t.Fatalf("placed on %q after a report without pools, want big: warm's VMMs are counted used", d.Node)
	}
	c.Release("s9")
	c.SetNode(warm) // refilled: 2 again; 3 GiB free
	if d := mustPlace(t, c, Request{Key: "s3", Snapshot: "py", MemoryBytes: 4 * gib}); d.Node != "big" {
		t.Fatalf("placed on %q, want big: warm has a VMM but not the room", d.Node)
	}
	if d := mustPlace(t, c, Request{Key: "s4", Snapshot: "py", MemoryBytes: gib}); d.Node != "warm" {
		t.Fatalf("placed on %q, want warm: room for 1 GiB and a VMM after the report", d.Node)
	}
}

// TestPlaceSpreadsOverThePools: the holder with the most pooled VMMs left
// goes first, so a burst uses every pool rather than emptying one.
func TestPlaceSpreadsOverThePools(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "x", Ready: true, MemoryBytes: 64 * gib, Snapshots: []string{"py"}, Warm: map[string]int{"py": 1}})
	c.SetNode(Node{Name: "y", Ready: true, MemoryBytes: 16 * gib, Snapshots: []string{"py"}, Warm: map[string]int{"py": 2}})
	var got []string
	for i := range 4 {
		got = append(got, mustPlace(t, c, Request{Key: fmt.Sprint("s", i), Snapshot: "py", MemoryBytes: gib}).Node)
	}
	if !slices.Equal(got, []string{"y", "x", "y", "x"}) {
		t.Fatalf("placed on %q, want y (2 left), then x and y at 1 each by free memory, then x by memory", got)
	}
}

func TestPlacePullsWhenNoHolderHasRoom(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "holder", Ready: true, MemoryBytes: 2 * gib, DiskFreeBytes: 100 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "big-no-disk", Ready: true, MemoryBytes: 64 * gib, DiskFreeBytes: 1 * gib})
	c.SetNode(Node{Name: "roomy", Ready: true, MemoryBytes: 32 * gib, DiskFreeBytes: 100 * gib})
	c.SetNode(Node{Name: "down", Ready: false, MemoryBytes: 128 * gib, DiskFreeBytes: 100 * gib, Snapshots: []string{"py"}})

	req := Request{Key: "s1", Snapshot: "py", MemoryBytes: 4 * gib, SnapshotBytes: 5 * gib}
	if _, err := c.Place(req); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("no holder with room and no image: got %v, want ErrNoCapacity", err)
	}
	req.Pullable = true
	if d := mustPlace(t, c, req); d != (Decision{Node: "roomy", Pull: true}) {
		t.Fatalf("placed %+v, want a pull to roomy (big-no-disk lacks the disk, down is not ready)", d)
	}
	// The next sandbox of that snapshot waits for the same pull instead of
	// starting another, though big-no-disk has more memory free.
	if d := mustPlace(t, c, Request{Key: "s2", Snapshot: "py", MemoryBytes: 4 * gib, Pullable: true}); d != (Decision{Node: "roomy", Pull: true}) {
		t.Fatalf("second sandbox placed %+v, want to wait for the pull on roomy", d)
	}
	// Once roomy reports the snapshot, it is a holder like any other.
	c.SetNode(Node{Name: "roomy", Ready: true, MemoryBytes: 32 * gib, DiskFreeBytes: 95 * gib, Snapshots: []string{"py"}})
	if d := mustPlace(t, c, Request{Key: "s3", Snapshot: "py", MemoryBytes: 4 * gib}); d != (Decision{Node: "roomy"}) {
		t.Fatalf("after the pull placed %+v, want roomy without a pull", d)
	}
}

func TestPullFailedSendsTheNextSandboxElsewhere(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "a", Ready: true, MemoryBytes: 32 * gib, DiskFreeBytes: 100 * gib})
	c.SetNode(Node{Name: "b", Ready: true, MemoryBytes: 30 * gib, DiskFreeBytes: 100 * gib})
	if d := mustPlace(t, c, Request{Key: "s1", Snapshot: "py", MemoryBytes: gib, Pullable: true}); d.Node != "a" {
		t.Fatalf("first pull to %q, want a", d.Node)
	}
	c.PullFailed("a", "py")
	c.Release("s1")
	c.SetNode(Node{Name: "a", Ready: false, MemoryBytes: 32 * gib, DiskFreeBytes: 100 * gib})
	if d := mustPlace(t, c, Request{Key: "s2", Snapshot: "py", MemoryBytes: gib, Pullable: true}); d != (Decision{Node: "b", Pull: true}) {
		t.Fatalf("after a's pull failed placed %+v, want a new pull to b", d)
	}
}

func TestReservationsReleaseAndNodeLoss(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "a", Ready: true, MemoryBytes: 4 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "b", Ready: true, MemoryBytes: 2 * gib, Snapshots: []string{"py"}})
	for i := range 3 {
		mustPlace(t, c, Request{Key: fmt.Sprint("s", i), Snapshot: "py", MemoryBytes: 2 * gib})
	}
	if _, err := c.Place(Request{Key: "s3", Snapshot: "py", MemoryBytes: 2 * gib}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("6 GiB of 6 reserved: got %v, want ErrNoCapacity", err)
	}
	// Placing a key again is idempotent: no second reservation.
	again := mustPlace(t, c, Request{Key: "s0", Snapshot: "py", MemoryBytes: 2 * gib})
	c.Release(again.Node + "-unknown") // no-op
	c.Release("s0")
	if d := mustPlace(t, c, Request{Key: "s3", Snapshot: "py", MemoryBytes: 2 * gib}); d.Node != again.Node {
		t.Fatalf("after releasing s0 from %s placed on %s", again.Node, d.Node)
	}

	lost := c.RemoveNode("a")
	// a took s0 and s1 (4 GiB free, then a tie with b won by the name),
	// b took s2, and s3 went to a once s0 was released.
	if want := []string{"s1", "s3"}; !slices.Equal(lost, want) {
		t.Fatalf("removing a lost %v, want %v", lost, want)
	}
	if _, err := c.Place(Request{Key: "s9", Snapshot: "py", MemoryBytes: gib}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("only b (full) left: got %v, want ErrNoCapacity", err)
	}
	if err := c.Bind("x", "a", gib); err == nil {
		t.Fatal("Bind to a removed node succeeded")
	}
}

func TestShrunkNodeIsNotChosen(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "a", Ready: true, MemoryBytes: 8 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "b", Ready: true, MemoryBytes: 4 * gib, Snapshots: []string{"py"}})
	if err := c.Bind("old", "a", 6*gib); err != nil {
		t.Fatal(err)
	}
	// a now reports less memory than is reserved on it.
	c.SetNode(Node{Name: "a", Ready: true, MemoryBytes: 2 * gib, Snapshots: []string{"py"}})
	if d := mustPlace(t, c, Request{Key: "s", Snapshot: "py", MemoryBytes: gib}); d.Node != "b" {
		t.Fatalf("placed on %q, want b: a is overcommitted", d.Node)
	}
}

// TestCommittedOnTheNodeCounts: memory a daemon reports committed beyond
// what placement reserved there (sandboxes forked on the node directly)
// leaves less room; committed memory of the controller's own sandboxes is
// not counted twice.
func TestCommittedOnTheNodeCounts(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "a", Ready: true, MemoryBytes: 8 * gib, CommittedBytes: 6 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "b", Ready: true, MemoryBytes: 4 * gib, Snapshots: []string{"py"}})
	if d := mustPlace(t, c, Request{Key: "s1", Snapshot: "py", MemoryBytes: 3 * gib}); d.Node != "b" {
		t.Fatalf("placed on %q, want b: a has 2 GiB left after 6 committed by others", d.Node)
	}
	// b reports the controller's own sandbox as committed: 1 GiB left,
	// not 4 - 3 - 3 < 0.
	c.SetNode(Node{Name: "b", Ready: true, MemoryBytes: 4 * gib, CommittedBytes: 3 * gib, Snapshots: []string{"py"}})
	if d := mustPlace(t, c, Request{Key: "s2", Snapshot: "py", MemoryBytes: gib}); d.Node != "a" {
		t.Fatalf("placed on %q, want a (2 GiB free against b's 1)", d.Node)
	}
	// a's new reservation counts on top of what others committed there.
	if d := mustPlace(t, c, Request{Key: "s3", Snapshot: "py", MemoryBytes: gib}); d.Node != "a" {
		t.Fatalf("placed on %q, want a (1 GiB free, ties with b, sorts first)", d.Node)
	}
	if _, err := c.Place(Request{Key: "s4", Snapshot: "py", MemoryBytes: 2 * gib}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("a 2 GiB sandbox placed with at most 1 GiB left anywhere: %v", err)
	}
}

// TestConcurrentPlacementsNeverOvercommit places from many goroutines at
// once; run with -race.
func TestConcurrentPlacementsNeverOvercommit(t *testing.T) {
	c := New()
	const nodes, perNode = 8, 16
	for i := range nodes {
		c.SetNode(Node{Name: fmt.Sprint("n", i), Ready: true, MemoryBytes: perNode * gib, Snapshots: []string{"py"}})
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[string]int{}
		failed int
	)
	for g := range 16 {
		wg.Go(func() {
			for i := range 10 {
				d, err := c.Place(Request{Key: fmt.Sprint(g, "/", i), Snapshot: "py", MemoryBytes: gib})
				mu.Lock()
				if err != nil {
					failed++
				} else {
					counts[d.Node]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := 0
	for n, k := range counts {
		if k > perNode {
			t.Errorf("node %s got %d sandboxes of 1 GiB, has %d GiB", n, k, perNode)
		}
		total += k
	}
	if want := min(160, nodes*perNode); total != want || failed != 160-want {
		t.Fatalf("placed %d, failed %d; want %d placed", total, failed, want)
	}
}

// TestPlaceAlsoKeys: a sandbox goes to a holder of its own key first,
// then of an Also key (another holder of a tag it may fork), and a pull
// is only ever of its own key.
func TestPlaceAlsoKeys(t *testing.T) {
	c := New()
	c.SetNode(Node{Name: "public", Ready: true, MemoryBytes: 64 * gib, DiskFreeBytes: 100 * gib, Snapshots: []string{"py"}})
	c.SetNode(Node{Name: "mine", Ready: true, MemoryBytes: 8 * gib, DiskFreeBytes: 100 * gib, Snapshots: []string{"@a/py"}})
	c.SetNode(Node{Name: "theirs", Ready: true, MemoryBytes: 128 * gib, DiskFreeBytes: 100 * gib, Snapshots: []string{"@b/py"}})
	if d := mustPlace(t, c, Request{Key: "s1", Snapshot: "@a/py", Also: []string{"py"}, MemoryBytes: 4 * gib}); d.Node != "mine" {
		t.Fatalf("placed on %q, want mine (its own key's holder, before the Also key's bigger one)", d.Node)
	}
	if d := mustPlace(t, c, Request{Key: "s2", Snapshot: "@a/py", Also: []string{"py"}, MemoryBytes: 6 * gib}); d.Node != "public" {
		t.Fatalf("placed on %q, want public (mine is full; theirs is another's)", d.Node)
	}
	d := mustPlace(t, c, Request{Key: "s3", Snapshot: "@c/py", MemoryBytes: 4 * gib, Pullable: true})
	if d.Node != "theirs" || !d.Pull {
		t.Fatalf("placed %+v, want a pull of @c/py to the roomiest node", d)
	}
}
