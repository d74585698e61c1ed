package state

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestIdempotencyRoundTripAndReopen: a state file from before keys reads as
// none; records survive reopening; deletes take several ids and ignore
// unknown ones; a record without an ID is refused.
func TestIdempotencyRoundTripAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Idempotency(); err != nil || len(got) != 0 {
		t.Fatalf("fresh store: %v %v", got, err)
	}
	if err := s.DeleteIdempotency("nope"); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fork := IdempotencyRecord{ID: "acme\nPOST /v1/sandboxes\nk1", Fingerprint: "f1", Created: now, Status: 201, Body: json.RawMessage(`{"sandboxes":[]}`)}
	create := IdempotencyRecord{ID: "acme\nPOST /v1/snapshots\nk2", Fingerprint: "f2", Created: now, Operation: "op-1"}
	for _, r := range []IdempotencyRecord{fork, create} {
		if err := s.PutIdempotency(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutIdempotency(IdempotencyRecord{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a record without an ID: %v, want invalid argument", err)
	}
	s.Close()
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Idempotency()
	if err != nil || !reflect.DeepEqual(got, []IdempotencyRecord{fork, create}) {
		t.Fatalf("after reopening: %+v %v", got, err)
	}
	if err := s.DeleteIdempotency(fork.ID, create.ID, "unknown"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Idempotency(); len(got) != 0 {
		t.Errorf("after deleting: %+v", got)
	}
}
