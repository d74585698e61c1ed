package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
)

// maxOperations bounds the finished operations kept for polling; the oldest
// finished ones are dropped first.
const maxOperations = 256

// operations tracks long-running requests (image builds) that outlive the
// HTTP request that started them: the client polls GET /v1/operations/{id}.
type operations struct {
	// store, if set, keeps operations across daemon restarts.
	store *state.Store

	// mu guards the fields below.
	mu  sync.Mutex
	ops map[string]*apiv1.Operation
}

// load reads recorded operations; one still running belonged to a daemon
// that died or stopped, and is marked failed.
func (o *operations) load(store *state.Store) error {
	o.store = store
	recs, err := store.Operations()
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ops == nil {
		o.ops = map[string]*apiv1.Operation{}
	}
	for _, rec := range recs {
		op := &apiv1.Operation{ID: rec.ID, Kind: rec.Kind, Target: rec.Target, State: rec.State,
			Created: rec.Created, Updated: rec.Updated, Progress: rec.Progress, Result: rec.Result, Tenant: auth.TenantOf(rec.Tenant)}
		if rec.Error != "" {
			var p apiv1.Problem
			if json.Unmarshal([]byte(rec.Error), &p) != nil {
				p = apiv1.Problem{Detail: rec.Error, Code: "internal", Status: 500}
			}
			op.Error = &p
		}
		if op.State == apiv1.OpRunning {
			p := ProblemOf(fmt.Errorf("the daemon stopped during this %s; start it again: %w", op.Kind, errdefs.ErrUnavailable), "")
			op.State, op.Error, op.Updated = apiv1.OpFailed, &p, time.Now().UTC()
			o.persistLocked(op)
		}
		o.ops[op.ID] = op
	}
	return nil
}

// persistLocked records op; the caller holds mu. Failures are logged by
// the store's caller only: an operation's record is best effort, the
// build itself is unaffected.
func (o *operations) persistLocked(op *apiv1.Operation) {
	if o.store == nil {
		return
	}
	rec := state.OperationRecord{ID: op.ID, Kind: op.Kind, State: op.State, Target: op.Target,
		Created: op.Created, Updated: op.Updated, Progress: op.Progress, Result: op.Result, Tenant: op.Tenant}
	if op.Error != nil {
		data, _ := json.Marshal(op.Error)
		rec.Error = string(data)
	}
	o.store.PutOperation(rec)
}

// start records a running operation of kind on target, started by tenant.
func (o *operations) start(kind, target, tenant string) *apiv1.Operation {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ops == nil {
		o.ops = map[string]*apiv1.Operation{}
	}
	o.pruneLocked()
	now := time.Now().UTC()
	op := &apiv1.Operation{ID: "op-" + snapshot.NewID(), Kind: kind, Target: target, State: apiv1.OpRunning, Created: now, Updated: now, Progress: []string{},
		Tenant: auth.TenantOf(tenant)}
	o.ops[op.ID] = op
	o.persistLocked(op)
	return op
}

func (o *operations) pruneLocked() {
	if len(o.ops) < maxOperations {
		return
	}
	var done []*apiv1.Operation
	for _, op := range o.ops {
		if op.State != apiv1.OpRunning {
			done = append(done, op)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].Updated.Before(done[j].Updated) })
	for i := 0; i < len(done) && len(o.ops) >= maxOperations; i++ {
		delete(o.ops, done[i].ID)
		if o.store != nil {
			o.store.DeleteOperation(done[i].ID)
		}
	}
}

func (o *operations) update(id string, f func(op *apiv1.Operation)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if op := o.ops[id]; op != nil {
		f(op)
		op.Updated = time.Now().UTC()
		// Progress lines are frequent; record state changes only.
		if op.State != apiv1.OpRunning {
			o.persistLocked(op)
		}
	}
}

// get returns a copy, safe to encode while the operation runs.
func (o *operations) get(id string) (apiv1.Operation, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	op := o.ops[id]
	if op == nil {
		return apiv1.Operation{}, false
	}
	c := *op
	c.Progress = append([]string(nil), op.Progress...)
	return c, true
}

func (o *operations) list() []apiv1.Operation {
	o.mu.Lock()
	ids := make([]string, 0, len(o.ops))
	for id := range o.ops {
		ids = append(ids, id)
	}
	o.mu.Unlock()
	out := []apiv1.Operation{}
	for _, id := range ids {
		if op, ok := o.get(id); ok {
			out = append(out, op)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// buildImage starts a build as an operation and answers 202 with it; the
// build runs on the daemon's context, not the request's.
func (s *Server) buildImage(w http.ResponseWriter, r *http.Request) {
	var req apiv1.BuildImageRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	rcp, err := s.Engine.ResolveRecipe(req.Recipe, req.RecipeTOML)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	// The slot is taken before the 202, so a daemon already building
	// --max-builds images, or a tenant at its bound of builds, answers
	// 429 (with Retry-After) instead of an operation that fails at once;
	// the build releases it.
	tenant, quota := s.buildOwner(r)
	slot, err := s.Engine.TryAcquireBuild("build image "+rcp.Name, tenant, quota)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	op := s.ops.start("image.build", rcp.Name, s.principalOf(r).Tenant)
	noteTargets(r, op.ID)
	go func() {
		img, err := s.Engine.BuildImageWith(context.Background(), slot, rcp, func(msg string) {
			s.ops.update(op.ID, func(op *apiv1.Operation) { op.Progress = append(op.Progress, msg) })
		})
		s.ops.update(op.ID, func(op *apiv1.Operation) {
			if err != nil {
				p := ProblemOf(err, "")
				op.State, op.Error = apiv1.OpFailed, &p
				return
			}
			info := imageInfo(img)
			data, _ := json.Marshal(info)
			op.State, op.Result = apiv1.OpSucceeded, data
		})
		s.auditOperationFinished(op.ID)
		if op, ok := s.ops.get(op.ID); ok {
			s.publishOperation(op)
		}
	}()
	cp, _ := s.ops.get(op.ID)
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(cp)
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	op, ok := s.ops.get(r.PathValue("id"))
	if !ok {
		writeProblem(w, r, errNoOperation(r.PathValue("id")))
		return
	}
	writeJSON(w, op)
}

// listOperations lists the operations of r's tenant (all for an admin).
func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) {
	p := s.principalOf(r)
	out := []apiv1.Operation{}
	for _, op := range s.ops.list() {
		if p.Sees(op.Tenant) {
			out = append(out, op)
		}
	}
	writeJSON(w, out)
}
