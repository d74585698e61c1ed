package state

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestSnapshotOwnersRoundTripAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// A state file from before tenants: no bucket, no records, deletes
	// are harmless.
	if got, err := s.SnapshotOwners(); err != nil || len(got) != 0 {
		t.Fatalf("fresh store: %v %v", got, err)
	}
	if err := s.DeleteSnapshotOwner("nope"); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := SnapshotOwnerRecord{Tag: "py", Tenant: "acme", SnapshotID: "snap-1", SharedWith: []string{"beta"}, Updated: now}
	b := SnapshotOwnerRecord{Tag: "base", Tenant: "default", Updated: now}
	for _, r := range []SnapshotOwnerRecord{a, b} {
		if err := s.PutSnapshotOwner(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutSnapshotOwner(SnapshotOwnerRecord{}); err == nil {
		t.Error("a record without a tag was stored")
	}
	// Sandboxes and operations name their tenant too.
	sb := sandbox("sb-t")
	sb.Tenant = "acme"
	if err := s.PutSandbox(sb); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOperation(OperationRecord{ID: "op-1", Kind: "image.build", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, path)
	got, err := s.SnapshotOwners()
	if err != nil || !reflect.DeepEqual(got, []SnapshotOwnerRecord{b, a}) {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
	if sbs, _ := s.Sandboxes(); len(sbs) != 1 || sbs[0].Tenant != "acme" {
		t.Errorf("sandbox tenant lost: %+v", sbs)
	}
	if ops, _ := s.Operations(); len(ops) != 1 || ops[0].Tenant != "acme" {
		t.Errorf("operation tenant lost: %+v", ops)
	}
	if err := s.DeleteSnapshotOwner("py"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.SnapshotOwners(); len(got) != 1 || got[0].Tag != "base" {
		t.Errorf("after delete: %+v", got)
	}
}

// TestRecordsWithoutTenantStillLoad: sandbox records written before
// tenants existed decode with an empty tenant (the default tenant's).
func TestRecordsWithoutTenantStillLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	old := map[string]any{"id": "sb-old", "tag": "py", "snapshot_id": "x", "created": time.Now().UTC(), "ready_ms": 1.0, "pooled": false, "state": "dead", "vmm": "qemu"}
	v, _ := json.Marshal(old)
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(sandboxesBucket).Put([]byte("sb-old"), v) }); err != nil {
		t.Fatal(err)
	}
	recs, err := s.Sandboxes()
	if err != nil || len(recs) != 1 || recs[0].ID != "sb-old" || recs[0].Tenant != "" {
		t.Fatalf("old record: %+v %v", recs, err)
	}
}
