package state

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sandbox(id string) SandboxRecord {
	return SandboxRecord{
		ID: id, Tag: "py", SnapshotID: "snap-1",
		Created:     time.Date(2026, 8, 1, 12, 0, 0, 123, time.UTC),
		ReadyMillis: 12.5, Pooled: true, State: "running",
		NetNS: "forkd-" + id, GuestIP: "10.0.0.2",
		Labels: map[string]string{"owner": "test"},
		VMM:    "qemu",
		Machine: vmm.MachineConfig{
			ID: id, RunDir: "/run/forkd/vms/" + id, MemoryMiB: 256, VCPUs: 1, Accel: vmm.AccelTCG,
			Image:      vmm.Image{Kernel: "/k", Initrd: "/i", KernelArgs: []string{"quiet"}},
			Network:    &vmm.Network{NetNSPath: "/run/netns/forkd-" + id, TapName: "tap0", MAC: "02:00:00:00:00:01"},
			MemoryFile: "/data/snap-1/memory", ConsoleLog: "/run/forkd/vms/" + id + "/console.log",
		},
		Process: vmm.ProcessIdentity{PID: 4242, StartTime: 987654},
	}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "state.db")
	s := open(t, path)
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v, %v; want 0600", st.Mode(), err)
	}
	if got, err := s.Sandboxes(); err != nil || len(got) != 0 {
		t.Fatalf("new store: %v %v", got, err)
	}
	a, b := sandbox("sb-a"), sandbox("sb-b")
	b.State, b.DeadReason, b.ConsoleTail = "dead", "VMM exited", "tick 3\n"
	for _, r := range []SandboxRecord{b, a} {
		if err := s.PutSandbox(r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []SandboxRecord{a, b}) {
		t.Errorf("Sandboxes = %+v\nwant %+v", got, []SandboxRecord{a, b})
	}
	if spec := got[0].AdoptSpec(); spec.Process.PID != 4242 || spec.Process.StartTime != 987654 || spec.RunDir != a.Machine.RunDir {
		t.Errorf("AdoptSpec = %+v", spec)
	}
	// A put replaces.
	a.State = "stopped"
	if err := s.PutSandbox(a); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Sandboxes(); len(got) != 2 || got[0].State != "stopped" {
		t.Errorf("after replacing: %+v", got)
	}
	for _, id := range []string{"sb-a", "sb-a", "nope"} {
		if err := s.DeleteSandbox(id); err != nil {
			t.Errorf("DeleteSandbox(%s): %v", id, err)
		}
	}
	if got, _ := s.Sandboxes(); len(got) != 1 || got[0].ID != "sb-b" {
		t.Errorf("after delete: %+v", got)
	}
	if err := s.PutSandbox(SandboxRecord{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("record without ID: %v", err)
	}

	op := OperationRecord{
		ID: "op-1", Kind: "template", State: "running", Target: "py",
		Created: time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC), Updated: time.Date(2026, 8, 1, 12, 0, 5, 0, time.UTC),
		Progress: []string{"image built", "booting"}, Result: json.RawMessage(`{"snapshot_id":"snap-1"}`),
	}
	if err := s.PutOperation(op); err != nil {
		t.Fatal(err)
	}
	ops, err := s.Operations()
	if err != nil || !reflect.DeepEqual(ops, []OperationRecord{op}) {
		t.Errorf("Operations = %+v, %v", ops, err)
	}
	if err := s.DeleteOperation("op-1"); err != nil {
		t.Fatal(err)
	}
	if ops, _ := s.Operations(); len(ops) != 0 {
		t.Errorf("after delete: %+v", ops)
	}
	if err := s.PutOperation(OperationRecord{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("operation without ID: %v", err)
	}

	// A closed store says so.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.PutSandbox(a); !errdefs.IsUnavailable(err) {
		t.Errorf("put after Close: %v", err)
	}
	if _, err := s.Sandboxes(); !errdefs.IsUnavailable(err) {
		t.Errorf("list after Close: %v", err)
	}
}

func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox("sb-keep")
	if err := s.PutSandbox(want); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOperation(OperationRecord{ID: "op-1", Kind: "snapshot"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	got, err := s.Sandboxes()
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("after reopening: %+v %v", got, err)
	}
	if ops, err := s.Operations(); err != nil || len(ops) != 1 {
		t.Errorf("operations after reopening: %+v %v", ops, err)
	}
	// No temporary files are left next to it.
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("directory holds %v", ents)
	}
}

func TestConcurrentPuts(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	const writers, each = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each*2)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("sb-%d-%d", w, i)
				errs <- s.PutSandbox(sandbox(id))
				errs <- s.PutOperation(OperationRecord{ID: "op-" + id, Kind: "fork"})
				if _, err := s.Sandboxes(); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Sandboxes()
	if err != nil || len(got) != writers*each {
		t.Errorf("%d sandboxes, %v; want %d", len(got), err, writers*each)
	}
	ops, err := s.Operations()
	if err != nil || len(ops) != writers*each {
		t.Errorf("%d operations, %v; want %d", len(ops), err, writers*each)
	}
}

func TestLockedByAnotherDaemon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Open(path) // its own open file: bbolt's flock conflicts
	took := time.Since(start)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "another forkd daemon holds "+path) {
		t.Errorf("second Open = %v", err)
	}
	if took > LockTimeout+time.Second {
		t.Errorf("second Open took %v", took)
	}
	t.Logf("%v after %v", err, took)
	s.Close()
	open(t, path)
}

// writeStore makes a state file with enough records to span many pages
// and returns its contents and the size its pages need.
func writeStore(t *testing.T, path string) ([]byte, int64) {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		r := sandbox(fmt.Sprintf("sb-%03d", i))
		r.ConsoleTail = strings.Repeat("console output ", 100)
		if err := s.PutSandbox(r); err != nil {
			t.Fatal(err)
		}
	}
	var need int64
	s.db.View(func(tx *bolt.Tx) error { need = tx.Size(); return nil })
	s.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data, need
}

func wantDamaged(t *testing.T, path, what string) {
	t.Helper()
	start := time.Now()
	_, err := Open(path)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "Move it aside") {
		t.Fatalf("%s: Open = %v; want FailedPrecondition naming the file and the fix", what, err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("%s: Open took %v", what, time.Since(start))
	}
	t.Logf("%s: %v", what, err)
}

func TestTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	data, need := writeStore(t, path)
	t.Logf("state file %d bytes, pages need %d", len(data), need)
	for _, size := range []int64{0, 100, 4096, 8192, 12288, need / 2, need - 4096} {
		if err := os.WriteFile(path, data[:size], 0o600); err != nil {
			t.Fatal(err)
		}
		wantDamaged(t, path, fmt.Sprintf("truncated to %d bytes", size))
	}
	// Every failed Open released the file: the intact file opens at once.
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, path)
	if got, err := s.Sandboxes(); err != nil || len(got) != 200 {
		t.Errorf("intact file: %d records, %v", len(got), err)
	}
}

func TestOverwritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	data, _ := writeStore(t, path)

	// Both metadata pages destroyed.
	bad := append([]byte(nil), data...)
	copy(bad, strings.Repeat("garbage!", 8192/8))
	os.WriteFile(path, bad, 0o600)
	wantDamaged(t, path, "metadata overwritten")

	// Data pages destroyed behind intact metadata.
	bad = append([]byte(nil), data...)
	for i := 8192; i < len(bad); i++ {
		bad[i] = 0xff
	}
	os.WriteFile(path, bad, 0o600)
	wantDamaged(t, path, "data pages overwritten")

	os.WriteFile(path, []byte("not a database at all, but long enough to look like one?\n"), 0o600)
	wantDamaged(t, path, "a text file")

	os.Remove(path)
	os.Mkdir(path, 0o700)
	wantDamaged(t, path, "a directory")
}

func TestNotAStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
	db.Close()
	wantDamaged(t, path, "someone else's bbolt file")
}

func TestNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.PutSandbox(sandbox("sb-1"))
	err = s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(metaBucket).Put(schemaKey, []byte(fmt.Sprint(SchemaVersion+1)))
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = Open(path)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "newer forkd") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a newer schema = %v", err)
	}
	t.Log(err)
}

func TestBadRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(sandboxesBucket).Put([]byte("sb-x"), []byte("{not json")) })
	s.Close()
	wantDamaged(t, path, "a record that does not decode")
}

// TestPutSandboxesCommitsAFork: a fork's children are recorded pending
// one by one and committed together; a record from before the field
// existed reads as committed.
func TestPutSandboxesCommitsAFork(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	kids := []SandboxRecord{sandbox("sb-1"), sandbox("sb-2"), sandbox("sb-3")}
	for _, k := range kids {
		k.PendingFork = "req-42"
		if err := s.PutSandbox(k); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Sandboxes()
	if err != nil || len(got) != 3 || got[0].PendingFork != "req-42" {
		t.Fatalf("pending records: %+v %v", got, err)
	}
	if err := s.PutSandboxes(kids); err != nil {
		t.Fatal(err)
	}
	got, err = s.Sandboxes()
	if err != nil || len(got) != 3 {
		t.Fatalf("committed records: %+v %v", got, err)
	}
	for _, r := range got {
		if r.PendingFork != "" {
			t.Errorf("%s still pending after the commit", r.ID)
		}
	}
	if err := s.PutSandboxes([]SandboxRecord{sandbox("sb-4"), {}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("batch with a record without an ID: %v", err)
	}
	if got, _ := s.Sandboxes(); len(got) != 3 {
		t.Fatalf("a refused batch wrote %d records", len(got)-3)
	}
	var old SandboxRecord
	if err := json.Unmarshal([]byte(`{"id":"sb-old","state":"running","vmm":"qemu"}`), &old); err != nil || old.PendingFork != "" {
		t.Fatalf("record without pending_fork: %+v %v", old, err)
	}
}
