package state

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Snapshot ownership: which tenant owns a snapshot tag, and which other
// tenants it is shared with (read-only: they may see and fork it). Kept
// here rather than in the snapshot's manifest, which is committed once
// and hashed; the API writes a record whenever it creates, imports or
// shares a tag and removes it with the tag. A tag without a record (made
// before tenants existed) belongs to the default tenant.
//
// Like the audit anchor, the bucket is created by the first write: a
// state file from before tenants has none, which reads as "no records".
var snapshotOwnersBucket = []byte("snapshot_owners")

// SnapshotOwnerRecord is the owner of one snapshot tag.
type SnapshotOwnerRecord struct {
	Tag    string `json:"tag"`
	Tenant string `json:"tenant"`
	// SnapshotID is the ID of the snapshot the record was written for;
	// empty while a background branch is still writing it. A record
	// whose ID is not the tag's current snapshot's is stale (the tag was
	// replaced behind the API's back) and is not trusted.
	SnapshotID string `json:"snapshot_id,omitempty"`
	// SharedWith are the tenants (or "*", every tenant) that may see and
	// fork the tag.
	SharedWith []string `json:"shared_with,omitempty"`
	// Origin is set on a snapshot that a fork by registry reference
	// pulled: what it was pulled from, which a later fork of the
	// reference checks before it uses the snapshot.
	Origin  *SnapshotOrigin `json:"origin,omitempty"`
	Updated time.Time       `json:"updated"`
}

// SnapshotOrigin is where a snapshot pulled for a fork came from.
type SnapshotOrigin struct {
	// Ref is the reference in its normal form (oci.Reference.String).
	Ref string `json:"ref"`
	// Digest is the digest of the manifest pulled.
	Digest string `json:"digest"`
}

// PutSnapshotOwner records a tag's owner, replacing any record for it. It
// returns once the record is durable.
func (s *Store) PutSnapshotOwner(rec SnapshotOwnerRecord) error {
	if rec.Tag == "" {
		return fmt.Errorf("state: %s record without a tag: %w", snapshotOwnersBucket, errdefs.ErrInvalidArgument)
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("state: %s %s: %w", snapshotOwnersBucket, rec.Tag, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(snapshotOwnersBucket)
		if err != nil {
			return err
		}
		return b.Put([]byte(rec.Tag), v)
	})
	return s.wrap("put", snapshotOwnersBucket, rec.Tag, err)
}

// DeleteSnapshotOwner removes a tag's record; an unknown tag is no error.
func (s *Store) DeleteSnapshotOwner(tag string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(snapshotOwnersBucket)
		if b == nil {
			return nil
		}
		return b.Delete([]byte(tag))
	})
	return s.wrap("delete", snapshotOwnersBucket, tag, err)
}

// SnapshotOwners returns every record, ordered by tag.
func (s *Store) SnapshotOwners() ([]SnapshotOwnerRecord, error) {
	var out []SnapshotOwnerRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(snapshotOwnersBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var rec SnapshotOwnerRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("record %q: %v; move the state file aside only if you accept that every snapshot then belongs to the default tenant: %w", k, err, errdefs.ErrFailedPrecondition)
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, s.wrap("list", snapshotOwnersBucket, "", err)
}
