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
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// maxOperations bounds the finished operations kept for polling; the oldest
// finished ones are dropped first.
const maxOperations = 256

// operations tracks long-running requests (image builds) that outlive the
// HTTP request that started them: the client polls GET /v1/operations/{id}.
type operations struct {
	// mu guards the fields below.
	mu  sync.Mutex
	ops map[string]*apiv1.Operation
}

func (o *operations) start(kind, target string) *apiv1.Operation {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ops == nil {
		o.ops = map[string]*apiv1.Operation{}
	}
	o.pruneLocked()
	now := time.Now().UTC()
	op := &apiv1.Operation{ID: "op-" + snapshot.NewID(), Kind: kind, Target: target, State: apiv1.OpRunning, Created: now, Updated: now, Progress: []string{}}
	o.ops[op.ID] = op
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
	}
}

func (o *operations) update(id string, f func(op *apiv1.Operation)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if op := o.ops[id]; op != nil {
		f(op)
		op.Updated = time.Now().UTC()
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
	if _, err := s.Engine.LoadRecipe(req.Recipe); err != nil {
		writeProblem(w, r, err)
		return
	}
	op := s.ops.start("image.build", req.Recipe)
	go func() {
		img, err := s.Engine.BuildImage(context.Background(), req.Recipe, func(msg string) {
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
		writeProblem(w, r, fmt.Errorf("no operation %q (operations are kept while the daemon runs): %w", r.PathValue("id"), errdefs.ErrNotFound))
		return
	}
	writeJSON(w, op)
}

func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.ops.list())
}
