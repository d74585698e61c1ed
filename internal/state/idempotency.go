package state

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Idempotency keys: the first result of a request sent with an
// Idempotency-Key header, so a retry after a daemon restart still gets it
// instead of doing the work twice. Like snapshot owners, the bucket is
// created by the first write: a state file from before keys has none,
// which reads as "no records".
var idempotencyBucket = []byte("idempotency")

// IdempotencyRecord is what a request with an Idempotency-Key did.
type IdempotencyRecord struct {
	// ID is the record's key in the store: tenant, route and key, joined
	// by the API (it is opaque here).
	ID string `json:"id"`
	// Fingerprint is a digest of the request (route and body): the same
	// key with another request is refused.
	Fingerprint string    `json:"fingerprint"`
	Created     time.Time `json:"created"`
	// Status and Body are the first answer (a finished request);
	// Operation the operation it started (a long one), whose state a
	// retry follows.
	Status    int             `json:"status,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	Operation string          `json:"operation,omitempty"`
}

// PutIdempotency records a key's result, replacing any record with its ID.
// It returns once the record is durable.
func (s *Store) PutIdempotency(rec IdempotencyRecord) error {
	if rec.ID == "" {
		return fmt.Errorf("state: %s record without an ID: %w", idempotencyBucket, errdefs.ErrInvalidArgument)
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("state: %s %s: %w", idempotencyBucket, rec.ID, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(idempotencyBucket)
		if err != nil {
			return err
		}
		return b.Put([]byte(rec.ID), v)
	})
	return s.wrap("put", idempotencyBucket, rec.ID, err)
}

// DeleteIdempotency removes records; unknown IDs are no error.
func (s *Store) DeleteIdempotency(ids ...string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(idempotencyBucket)
		if b == nil {
			return nil
		}
		for _, id := range ids {
			if err := b.Delete([]byte(id)); err != nil {
				return err
			}
		}
		return nil
	})
	return s.wrap("delete", idempotencyBucket, fmt.Sprintf("(%d records)", len(ids)), err)
}

// Idempotency returns every record, ordered by ID. A record that does not
// decode is skipped: losing a key's replay is a retry doing the work again,
// not a reason to refuse to start.
func (s *Store) Idempotency() ([]IdempotencyRecord, error) {
	var out []IdempotencyRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(idempotencyBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var rec IdempotencyRecord
			if json.Unmarshal(v, &rec) == nil && rec.ID != "" {
				out = append(out, rec)
			}
			return nil
		})
	})
	return out, s.wrap("list", idempotencyBucket, "", err)
}
