package api

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/state"
)

// Snapshot ownership. Each tag the API creates (create, branch, compact,
// import) is recorded as its creator's tenant's, and may be shared with
// other tenants read-only: they see it and fork it, nothing else. Tags
// without a record (made before tenants existed, or by hand) belong to
// auth.DefaultTenant, which only admins and that tenant see.

// ownerStore keeps ownership records durably (*state.Store).
type ownerStore interface {
	PutSnapshotOwner(state.SnapshotOwnerRecord) error
	DeleteSnapshotOwner(tag string) error
	SnapshotOwners() ([]state.SnapshotOwnerRecord, error)
}

// snapshotOwners is the ownership records, by tag.
type snapshotOwners struct {
	// store, if set, keeps the records across restarts.
	store ownerStore

	// mu guards recs.
	mu   sync.Mutex
	recs map[string]state.SnapshotOwnerRecord
}

func (o *snapshotOwners) load(store ownerStore) error {
	recs, err := store.SnapshotOwners()
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.store = store
	o.recs = map[string]state.SnapshotOwnerRecord{}
	for _, r := range recs {
		o.recs[r.Tag] = r
	}
	return nil
}

// putLocked records rec in memory and in the store; o.mu is held.
func (o *snapshotOwners) putLocked(rec state.SnapshotOwnerRecord) error {
	if o.recs == nil {
		o.recs = map[string]state.SnapshotOwnerRecord{}
	}
	rec.Updated = time.Now().UTC()
	o.recs[rec.Tag] = rec
	if o.store == nil {
		return nil
	}
	return o.store.PutSnapshotOwner(rec)
}

// claim makes tenant the owner of tag, a snapshot just created with id
// (empty: a background branch still writing it), not shared. A record that
// cannot be written leaves the tag the default tenant's after a restart:
// its creator loses sight of it, nobody else gains it.
func (o *snapshotOwners) claim(tag, tenant, id string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.putLocked(state.SnapshotOwnerRecord{Tag: tag, Tenant: auth.TenantOf(tenant), SnapshotID: id})
}

// claimOrigin is claim for a snapshot a fork by reference pulled: it
// records where it came from as well.
func (o *snapshotOwners) claimOrigin(tag, tenant, id string, origin state.SnapshotOrigin) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.putLocked(state.SnapshotOwnerRecord{Tag: tag, Tenant: auth.TenantOf(tenant), SnapshotID: id, Origin: &origin})
}

// origin returns the owner and origin recorded for tag's snapshot id:
// ok only when the record was made for that very snapshot by a fork by
// reference.
func (o *snapshotOwners) origin(tag, id string) (tenant string, origin state.SnapshotOrigin, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, found := o.recs[tag]
	if !found || rec.Origin == nil || id == "" || rec.SnapshotID != id {
		return "", state.SnapshotOrigin{}, false
	}
	return auth.TenantOf(rec.Tenant), *rec.Origin, true
}

// forget drops the records of removed tags.
func (o *snapshotOwners) forget(tags ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range tags {
		delete(o.recs, t)
		if o.store != nil {
			o.store.DeleteSnapshotOwner(t)
		}
	}
}

// owner returns who owns tag, whose current snapshot has id (empty when
// it is still being written), and with whom it is shared. A record made
// for another snapshot under the tag is stale: the tag is then the
// default tenant's. A record made while the tag was being written learns
// its id here.
func (o *snapshotOwners) owner(tag, id string) (tenant string, shared []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, ok := o.recs[tag]
	switch {
	case !ok:
		return auth.DefaultTenant, nil
	case rec.SnapshotID == "" && id != "":
		rec.SnapshotID = id
		o.putLocked(rec)
	case rec.SnapshotID != "" && id != "" && rec.SnapshotID != id:
		return auth.DefaultTenant, nil
	}
	return auth.TenantOf(rec.Tenant), slices.Clone(rec.SharedWith)
}

// share adds (or, with add false, removes) tenant to the tenants tag is
// shared with, and returns them.
func (o *snapshotOwners) share(tag, id, owner, tenant string, add bool) ([]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, ok := o.recs[tag]
	if !ok || (rec.SnapshotID != "" && rec.SnapshotID != id) {
		rec = state.SnapshotOwnerRecord{Tag: tag, Tenant: owner, SnapshotID: id}
	}
	rec.SnapshotID = id
	has := slices.Contains(rec.SharedWith, tenant)
	switch {
	case add && !has:
		rec.SharedWith = append(slices.Clone(rec.SharedWith), tenant)
		sort.Strings(rec.SharedWith)
	case !add && has:
		rec.SharedWith = slices.DeleteFunc(slices.Clone(rec.SharedWith), func(t string) bool { return t == tenant })
	default:
		return slices.Clone(rec.SharedWith), nil
	}
	if err := o.putLocked(rec); err != nil {
		return nil, fmt.Errorf("snapshot %q: record its sharing: %w", tag, err)
	}
	return slices.Clone(rec.SharedWith), nil
}

// snapAccess is what one principal may do with one tag.
type snapAccess struct {
	exists bool // committed, or being written by a background branch
	seen   bool // p may see and fork it
	owned  bool // p may remove, export, compact and share it
	owner  string
	shared []string
}

// snapshotAccess works out what p may do with tag.
func (s *Server) snapshotAccess(p auth.Principal, tag string) snapAccess {
	var a snapAccess
	id := ""
	if snap, err := s.Engine.Store().Get(tag); err == nil {
		a.exists, id = true, snap.ID
	} else if _, ok := s.Engine.Pending(tag); ok {
		a.exists = true
	}
	if !a.exists {
		return a
	}
	a.owner, a.shared = s.owners.owner(tag, id)
	a.owned = p.Sees(a.owner)
	// An admin acting for a tenant still sees (as shared) what its own
	// tenant owns: the operator's base images.
	a.seen = a.owned || sharedWith(a.shared, p.Tenant) || (p.Operator != "" && auth.TenantOf(a.owner) == p.Operator)
	return a
}

func sharedWith(shared []string, tenant string) bool {
	return slices.Contains(shared, auth.TenantOf(tenant)) || slices.Contains(shared, apiv1.ShareAll)
}

// snapshotNotFound is the store's not-found error as p may read it: it
// lists the tags p sees, not every tag.
func (s *Server) snapshotNotFound(p auth.Principal, tag string) error {
	var seen []string
	if tags, err := s.Engine.Store().Tags(); err == nil {
		for _, t := range tags {
			if s.snapshotAccess(p, t).seen {
				seen = append(seen, t)
			}
		}
	}
	known := "none yet; create one with `forkd snapshot create --tag TAG --recipe minimal`"
	if len(seen) > 0 {
		known = strings.Join(seen, ", ")
	}
	return fmt.Errorf("no snapshot tagged %q (existing tags: %s): %w", tag, known, errdefs.ErrNotFound)
}

// scopeSnapshotErr keeps a snapshot error from the engine within what p
// may read: a not-found lists every tag, so it is replaced by p's.
func (s *Server) scopeSnapshotErr(p auth.Principal, tag string, err error) error {
	if err != nil && !p.Admin() && errdefs.IsNotFound(err) {
		return s.snapshotNotFound(p, tag)
	}
	return err
}

// scopeSnapshotView fills in a snapshot's owner for p, with whom it is
// shared when p owns it, and drops from its chain the tags p cannot see.
func (s *Server) scopeSnapshotView(p auth.Principal, out *apiv1.Snapshot) {
	out.Owner, out.SharedWith = s.owners.owner(out.Tag, out.ID)
	if !p.Sees(out.Owner) {
		out.SharedWith = nil
	}
	if p.Admin() {
		return
	}
	visible := func(tags []string) []string {
		var keep []string
		for _, t := range tags {
			if s.snapshotAccess(p, t).seen {
				keep = append(keep, t)
			}
		}
		return keep
	}
	out.Ancestors, out.Dependents = visible(out.Ancestors), visible(out.Dependents)
	if out.Parent != nil && !s.snapshotAccess(p, out.Parent.Tag).seen {
		out.Parent = &apiv1.ParentRef{Digest: out.Parent.Digest}
	}
}
