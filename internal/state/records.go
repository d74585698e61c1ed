package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// SandboxRecord is what a later daemon needs to know about a sandbox: what
// the API reports, and how to find and adopt its VMM process.
type SandboxRecord struct {
	ID          string            `json:"id"`
	Tag         string            `json:"tag"`
	SnapshotID  string            `json:"snapshot_id"`
	Created     time.Time         `json:"created"`
	ReadyMillis float64           `json:"ready_ms"`
	Pooled      bool              `json:"pooled"`
	State       string            `json:"state"` // apiv1.State*
	DeadReason  string            `json:"dead_reason,omitempty"`
	ConsoleTail string            `json:"console_tail,omitempty"`
	NetNS       string            `json:"netns,omitempty"`
	GuestIP     string            `json:"guest_ip,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// NetNSInode is the inode of the sandbox's network namespace
	// (netns.NS.Inode): a later daemon reaches the namespace through the
	// VMM process and checks that it is this one. 0 in records written
	// before it existed.
	NetNSInode uint64 `json:"netns_inode,omitempty"`
	// Network is the sandbox's egress policy (absent: none, as every
	// sandbox recorded before policies existed).
	Network *egress.Policy `json:"network,omitempty"`
	// ExpiresAt is the absolute timeout (zero: none); IdleTimeoutSeconds
	// the idle one (0: none). A later daemon keeps enforcing both.
	ExpiresAt          time.Time `json:"expires_at,omitempty"`
	IdleTimeoutSeconds int64     `json:"idle_timeout_s,omitempty"`
	// EndedAt is when a dead sandbox's VMM was found gone (zero while it
	// runs, and in records written before it existed): the dead leave
	// the list a retention period after it.
	EndedAt time.Time `json:"ended_at,omitempty"`
	// VMM is the driver that started the machine ("qemu"): only it can
	// adopt the process.
	VMM string `json:"vmm"`
	// Machine is the machine's configuration as it reported it
	// (vmm.Machine.Config), and Process its process identity
	// (vmm.Identifiable): together the vmm.AdoptSpec.
	Machine vmm.MachineConfig   `json:"machine"`
	Process vmm.ProcessIdentity `json:"process"`
	// BaseManifest is the manifest of the snapshot the sandbox was forked
	// from (snapshot.Manifest as JSON): a full or live branch needs its
	// shape, image and recipe even after that tag is removed or replaced.
	// Absent in records written before it existed.
	BaseManifest json.RawMessage `json:"base_manifest,omitempty"`
	// PendingFork is the request id of the fork that created the sandbox,
	// while that fork has not answered: the sandbox is recorded as soon
	// as it is ready, before its siblings are, so no VMM is ever running
	// unrecorded, but no client has its id yet. The fork clears it for all
	// its children at once (PutSandboxes) when it answers. A daemon that
	// starts with such a record kills the VMM and forgets the record:
	// nobody could use or kill that sandbox. Records written before this
	// field existed read as committed.
	PendingFork string `json:"pending_fork,omitempty"`
	// Tenant is the tenant whose token forked the sandbox. Records
	// written before tenants existed have none: they belong to the
	// default tenant (auth.TenantOf), which only admins see.
	Tenant string `json:"tenant,omitempty"`
	// CPUMillicores is the CPU limit the fork asked for (0: the default).
	CPUMillicores int64 `json:"cpu_millicores,omitempty"`
	// PageServed: the guest's memory was served by the daemon's page
	// server (the uffd memory backend), which ended with that daemon: a
	// later daemon cannot adopt the VMM, whose next missing page would
	// hang or read zeros.
	PageServed bool `json:"page_served,omitempty"`
}

// AdoptSpec is the spec to adopt the sandbox's VMM with.
func (r SandboxRecord) AdoptSpec() vmm.AdoptSpec {
	return vmm.AdoptSpec{MachineConfig: r.Machine, Process: r.Process}
}

// OperationRecord is a long-running operation (a template build, a
// snapshot) and where it got to.
type OperationRecord struct {
	ID       string          `json:"id"`
	Kind     string          `json:"kind"`
	State    string          `json:"state"`
	Target   string          `json:"target,omitempty"`
	Created  time.Time       `json:"created"`
	Updated  time.Time       `json:"updated"`
	Progress []string        `json:"progress,omitempty"`
	Error    string          `json:"error,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	// Tenant started the operation (absent before tenants existed: the
	// default tenant's).
	Tenant string `json:"tenant,omitempty"`
}

// PutSandbox records a sandbox, replacing any record with its ID. It
// returns once the record is durable.
func (s *Store) PutSandbox(rec SandboxRecord) error {
	return s.put(sandboxesBucket, rec.ID, rec)
}

// PutSandboxes records several sandboxes in one transaction: when it
// returns, all of them are durable, or none was written.
func (s *Store) PutSandboxes(recs []SandboxRecord) error {
	vals := make([][]byte, len(recs))
	for i, rec := range recs {
		if rec.ID == "" {
			return fmt.Errorf("state: %s record without an ID: %w", sandboxesBucket, errdefs.ErrInvalidArgument)
		}
		v, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("state: %s %s: %w", sandboxesBucket, rec.ID, err)
		}
		vals[i] = v
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(sandboxesBucket)
		for i, rec := range recs {
			if err := b.Put([]byte(rec.ID), vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
	return s.wrap("put", sandboxesBucket, fmt.Sprintf("(%d records)", len(recs)), err)
}

// DeleteSandbox removes a sandbox's record; an unknown ID is no error.
func (s *Store) DeleteSandbox(id string) error {
	return s.delete(sandboxesBucket, id)
}

// Sandboxes returns every sandbox record, ordered by ID.
func (s *Store) Sandboxes() ([]SandboxRecord, error) {
	return list[SandboxRecord](s, sandboxesBucket)
}

// PutOperation records an operation, replacing any record with its ID. It
// returns once the record is durable.
func (s *Store) PutOperation(rec OperationRecord) error {
	return s.put(operationsBucket, rec.ID, rec)
}

// DeleteOperation removes an operation's record; an unknown ID is no
// error.
func (s *Store) DeleteOperation(id string) error {
	return s.delete(operationsBucket, id)
}

// Operations returns every operation record, ordered by ID.
func (s *Store) Operations() ([]OperationRecord, error) {
	return list[OperationRecord](s, operationsBucket)
}

func (s *Store) put(bucket []byte, id string, rec any) error {
	if id == "" {
		return fmt.Errorf("state: %s record without an ID: %w", bucket, errdefs.ErrInvalidArgument)
	}
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("state: %s %s: %w", bucket, id, err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(id), v) })
	return s.wrap("put", bucket, id, err)
}

func (s *Store) delete(bucket []byte, id string) error {
	err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(id)) })
	return s.wrap("delete", bucket, id, err)
}

func list[T any](s *Store, bucket []byte) ([]T, error) {
	var out []T
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			var rec T
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("record %q: %v: %w", k, err, errdefs.ErrFailedPrecondition)
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, s.wrap("list", bucket, "", err)
}

// wrap adds the store's context to an error; a closed store is
// ErrUnavailable.
func (s *Store) wrap(op string, bucket []byte, id string, err error) error {
	if err == nil {
		return nil
	}
	what := string(bucket)
	if id != "" {
		what += " " + id
	}
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("state %s: %s %s: store closed: %w", s.path, op, what, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("state %s: %s %s: %w", s.path, op, what, err)
}

// checkRecord checks that a stored value decodes as its bucket's record.
func checkRecord(bucket, key, value []byte) error {
	var err error
	switch string(bucket) {
	case string(sandboxesBucket):
		var r SandboxRecord
		err = json.Unmarshal(value, &r)
	case string(operationsBucket):
		var r OperationRecord
		err = json.Unmarshal(value, &r)
	}
	if err != nil {
		return fmt.Errorf("%s record %q: %v", bucket, key, err)
	}
	return nil
}
