package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// The audit log's anchor (audit.Anchor: seq, hash and file of its newest
// record) is kept here, outside the log directory, so that a log cut from
// its end or deleted is seen at the next start (audit.Open) and by
// `forkd audit verify`. It has a bucket of its own, created by the first
// write: a state file from before anchors existed has none, which reads as
// "not anchored yet" (audit.Open then anchors the log where it ends).
var (
	auditAnchorBucket = []byte("audit_anchor")
	auditAnchorKey    = []byte("head")
)

// Store implements audit.AnchorStore.
var _ audit.AnchorStore = (*Store)(nil)

// AuditAnchor returns the audit log's anchor, or the zero Anchor when none
// was stored. A stored anchor that does not decode is
// errdefs.ErrFailedPrecondition, naming the way out.
func (s *Store) AuditAnchor() (audit.Anchor, error) {
	var a audit.Anchor
	err := s.db.View(func(tx *bolt.Tx) error { return readAnchor(tx, s.path, &a) })
	if err != nil && !errdefs.IsFailedPrecondition(err) {
		err = s.wrap("read", auditAnchorBucket, string(auditAnchorKey), err)
	}
	return a, err
}

// PutAuditAnchor replaces the audit log's anchor; it returns once the
// anchor is durable (bbolt fsyncs each transaction). audit.Log calls it
// after each record's own fsync, never before.
func (s *Store) PutAuditAnchor(a audit.Anchor) error {
	v, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("state: audit anchor: %w", err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(auditAnchorBucket)
		if err != nil {
			return err
		}
		return b.Put(auditAnchorKey, v)
	})
	return s.wrap("put", auditAnchorBucket, string(auditAnchorKey), err)
}

func readAnchor(tx *bolt.Tx, path string, a *audit.Anchor) error {
	b := tx.Bucket(auditAnchorBucket)
	if b == nil {
		return nil
	}
	v := b.Get(auditAnchorKey)
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(v, a); err != nil || a.Seq == 0 || len(a.Hash) != 64 {
		*a = audit.Anchor{}
		return fmt.Errorf("state file %s: the audit log's anchor is unreadable (%.200q); with the daemon stopped, run `forkd audit verify` to check the chain, then `forkd audit reset-anchor --i-know` to anchor the log where it ends: %w",
			path, v, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// ReadAuditAnchor reads the audit log's anchor from the state file at path
// without opening it for writing: bbolt's read-only mode takes a shared
// lock, which a running daemon's exclusive lock excludes, so with a daemon
// running it gives up after timeout with errdefs.ErrUnavailable (stop the
// daemon; it checks the anchor itself when it starts). A missing file is
// errdefs.ErrNotFound; the zero Anchor means none was stored. For
// `forkd audit verify`, which must not need a daemon.
func ReadAuditAnchor(path string, timeout time.Duration) (a audit.Anchor, err error) {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return a, fmt.Errorf("no state file at %s: %w", path, errdefs.ErrNotFound)
	case err != nil:
		return a, fmt.Errorf("state file: %w", err)
	case !st.Mode().IsRegular() || st.Size() == 0:
		return a, damaged(path, "not a regular file, or empty")
	}
	// As in openBolt: a damaged file can make bbolt panic or fault.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			a, err = audit.Anchor{}, damaged(path, fmt.Sprint("reading it failed: ", r))
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return a, fmt.Errorf("state file %s is held by a running forkd daemon (no read-only access within %v); stop the daemon to check the audit log's anchor (the daemon checks it when it starts): %w",
			path, timeout, errdefs.ErrUnavailable)
	case err != nil:
		return a, damaged(path, err.Error())
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error { return readAnchor(tx, path, &a) })
	return a, err
}
