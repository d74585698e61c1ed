// Package state is forkd's durable record of what the daemon has created:
// sandboxes and operations, kept in one embedded bbolt file (STATE, e.g.
// DATA_DIR/state.db) so that a restarted daemon, after SIGTERM or SIGKILL,
// forgets nothing it reported as created.
//
// Every Put and Delete is one bbolt transaction, durable (fsynced) when it
// returns. Values are JSON, in one bucket per record kind, keyed by ID.
//
// Only one process can open a state file: bbolt locks it (flock), and Open
// gives up after LockTimeout with an errdefs.ErrUnavailable-class error.
// A state file that is damaged (truncated, overwritten, not a forkd state
// file) or written by a newer forkd is refused with an
// errdefs.ErrFailedPrecondition-class error that names the file and the
// way out; it is never silently replaced by an empty one.
package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// SchemaVersion is the layout of the state file this forkd writes. A file
// with a newer version is refused (an older forkd cannot know what a newer
// one recorded); older versions would be migrated by Open.
const SchemaVersion = 1

// LockTimeout is how long Open waits for another process (a daemon still
// shutting down) to release the state file.
const LockTimeout = 2 * time.Second

var (
	metaBucket       = []byte("meta")
	schemaKey        = []byte("schema")
	sandboxesBucket  = []byte("sandboxes")
	operationsBucket = []byte("operations")

	recordBuckets = [][]byte{sandboxesBucket, operationsBucket}
)

// Store is an open state file. It is safe for concurrent use.
type Store struct {
	path string
	db   *bolt.DB
}

// Open opens the state file at path, creating it (mode 0600, and its
// directory) when it does not exist, and checks it: schema version, size
// and every record. See the package doc for the errors.
func Open(path string) (*Store, error) {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := create(path); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("state file: %w", err)
	case !st.Mode().IsRegular():
		return nil, damaged(path, "not a regular file")
	case st.Size() == 0:
		// Never a file Open made: those are complete before they get
		// their name (see create). bbolt would make it a new database.
		return nil, damaged(path, "the file is empty")
	}
	db, err := openBolt(path)
	if err != nil {
		return nil, err
	}
	s := &Store{path: path, db: db}
	if err := s.verify(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Path is the state file's path.
func (s *Store) Path() string { return s.path }

// Close closes the state file and releases its lock. Closing twice is
// harmless; the store's methods then fail with errdefs.ErrUnavailable.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("state %s: close: %w", s.path, err)
	}
	return nil
}

// create makes a new, empty state file at path. It is initialised under a
// temporary name and linked into place, so a file at path is always
// complete: an empty or short one is damage, not an interrupted creation.
// When another process creates path first, its file is kept.
func create(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	f, err := os.CreateTemp(dir, ".state-*.db")
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: LockTimeout})
	if err != nil {
		return fmt.Errorf("state file: create %s: %w", tmp, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(metaBucket)
		if err != nil {
			return err
		}
		if err := meta.Put(schemaKey, []byte(strconv.Itoa(SchemaVersion))); err != nil {
			return err
		}
		for _, name := range recordBuckets {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("state file: create %s: %w", tmp, err)
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("state file: %w", err)
	}
	if err := fsutil.SyncDir(dir); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// openBolt opens the database, turning a lock timeout into
// ErrUnavailable and damage into ErrFailedPrecondition. bbolt can panic on
// a damaged file, or fault reading a page past the end of a truncated one
// (SIGBUS on its memory map): both become errors, and the file's lock is
// released (its memory map leaks, once, on the way to a startup error).
func openBolt(path string) (db *bolt.DB, err error) {
	var file *os.File
	opts := &bolt.Options{
		Timeout: LockTimeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				// bbolt's memory map of the file (not unmapped here) keeps
				// the open file, and so its lock, alive: unlock explicitly.
				syscall.Flock(int(file.Fd()), syscall.LOCK_UN)
				file.Close()
			}
			db, err = nil, damaged(path, fmt.Sprint("reading it failed: ", r))
		}
	}()
	db, err = bolt.Open(path, 0o600, opts)
	var perr *fs.PathError
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("another forkd daemon holds %s (its lock was not released within %v); stop that daemon first: %w", path, LockTimeout, errdefs.ErrUnavailable)
	case errors.As(err, &perr):
		return nil, fmt.Errorf("state file: %w", err)
	default:
		return nil, damaged(path, err.Error())
	}
}

// verify checks the schema version, that the file holds every page its
// metadata refers to, and that every record decodes. bbolt checks only
// the metadata pages when it opens a file; the rest is read here, once,
// with the same protection as openBolt.
func (s *Store) verify() (err error) {
	st, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = damaged(s.path, fmt.Sprint("reading it failed: ", r))
		}
	}()
	return s.db.View(func(tx *bolt.Tx) error {
		if tx.Size() > st.Size() {
			return damaged(s.path, fmt.Sprintf("truncated: %d bytes, its pages need %d", st.Size(), tx.Size()))
		}
		meta := tx.Bucket(metaBucket)
		if meta == nil {
			return damaged(s.path, "no schema version: not a forkd state file")
		}
		v, err := strconv.Atoi(string(meta.Get(schemaKey)))
		switch {
		case err != nil || v < 1:
			return damaged(s.path, fmt.Sprintf("schema version %q", meta.Get(schemaKey)))
		case v > SchemaVersion:
			return fmt.Errorf("state file %s was written by a newer forkd (schema %d; this forkd knows up to %d): run that forkd version or newer: %w",
				s.path, v, SchemaVersion, errdefs.ErrFailedPrecondition)
		}
		for _, name := range recordBuckets {
			b := tx.Bucket(name)
			if b == nil {
				return damaged(s.path, fmt.Sprintf("bucket %q missing", name))
			}
			if err := b.ForEach(func(k, v []byte) error { return checkRecord(name, k, v) }); err != nil {
				return damaged(s.path, err.Error())
			}
		}
		return nil
	})
}

// damaged is the error for a state file forkd cannot trust.
func damaged(path, why string) error {
	return fmt.Errorf("state file %s is damaged (%s). forkd does not start on it, so nothing it recorded is lost silently. "+
		"Move it aside (mv %s %s.damaged) to start with an empty state: the daemon then kills the VMM processes it cannot account for: %w",
		path, why, path, path, errdefs.ErrFailedPrecondition)
}
