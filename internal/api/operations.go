package api

import (
	"context"
	"encoding/json"
	"fmt"
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

// maxProgressLines bounds the progress lines an operation keeps (the
// oldest are dropped first); followers that fall further behind miss the
// dropped ones.
const maxProgressLines = 1000

// operations tracks daemon-owned work (operation_run.go) that outlives the
// HTTP request that started it: clients poll GET /v1/operations/{id} or
// follow its events, and may cancel it.
type operations struct {
	// store, if set, keeps operations across daemon restarts.
	store *state.Store

	// mu guards the fields below.
	mu  sync.Mutex
	ops map[string]*opEntry
}

// opEntry is one operation and what its followers and cancel need.
type opEntry struct {
	op apiv1.Operation
	// seq counts the progress lines ever added (op.Progress keeps the
	// latest maxProgressLines): a follower's position.
	seq int
	// changed is closed, and replaced, on every change.
	changed chan struct{}
	// cancel cancels the work; nil for an operation a former daemon ran.
	cancel context.CancelCauseFunc
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
		o.ops = map[string]*opEntry{}
	}
	for _, rec := range recs {
		op := apiv1.Operation{ID: rec.ID, Kind: rec.Kind, Target: rec.Target, State: rec.State,
			Created: rec.Created, Updated: rec.Updated, Progress: rec.Progress, Result: rec.Result, Tenant: auth.TenantOf(rec.Tenant)}
		if op.Progress == nil {
			op.Progress = []string{}
		}
		if rec.Error != "" {
			var p apiv1.Problem
			if json.Unmarshal([]byte(rec.Error), &p) != nil {
				p = apiv1.Problem{Detail: rec.Error, Code: "internal", Status: 500}
			}
			op.Error = &p
		}
		e := &opEntry{op: op, seq: len(op.Progress), changed: make(chan struct{})}
		if op.State == apiv1.OpRunning {
			p := ProblemOf(fmt.Errorf("the daemon stopped during this %s; start it again: %w", op.Kind, errdefs.ErrUnavailable), "")
			e.op.State, e.op.Error, e.op.Updated = apiv1.OpFailed, &p, time.Now().UTC()
			o.persistLocked(&e.op)
		}
		o.ops[op.ID] = e
	}
	return nil
}

// persistLocked records op; the caller holds mu. An operation's record is
// best effort: the work itself is unaffected by a failed write.
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

// start records a running operation of kind on target, started by tenant;
// cancel, if set, is what POST /v1/operations/{id}/cancel calls.
func (o *operations) start(kind, target, tenant string, cancel ...context.CancelCauseFunc) apiv1.Operation {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ops == nil {
		o.ops = map[string]*opEntry{}
	}
	o.pruneLocked()
	now := time.Now().UTC()
	e := &opEntry{changed: make(chan struct{}), op: apiv1.Operation{
		ID: "op-" + snapshot.NewID(), Kind: kind, Target: target, State: apiv1.OpRunning, Created: now, Updated: now, Progress: []string{},
		Tenant: auth.TenantOf(tenant)}}
	if len(cancel) > 0 {
		e.cancel = cancel[0]
	}
	o.ops[e.op.ID] = e
	o.persistLocked(&e.op)
	return cloneOp(e.op)
}

// drop forgets an operation whose work never started.
func (o *operations) drop(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.ops, id)
	if o.store != nil {
		o.store.DeleteOperation(id)
	}
}

func (o *operations) pruneLocked() {
	if len(o.ops) < maxOperations {
		return
	}
	var done []*opEntry
	for _, e := range o.ops {
		if e.op.Terminal() {
			done = append(done, e)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].op.Updated.Before(done[j].op.Updated) })
	for i := 0; i < len(done) && len(o.ops) >= maxOperations; i++ {
		delete(o.ops, done[i].op.ID)
		if o.store != nil {
			o.store.DeleteOperation(done[i].op.ID)
		}
	}
}

// update changes a running operation with f and tells its followers. A
// finished operation does not change any more.
func (o *operations) update(id string, f func(op *apiv1.Operation)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.ops[id]
	if e == nil || e.op.Terminal() {
		return
	}
	f(&e.op)
	e.op.Updated = time.Now().UTC()
	if e.op.Terminal() {
		e.cancel = nil
	}
	o.changedLocked(e)
	// Progress is frequent; record state changes only.
	if e.op.Terminal() {
		o.persistLocked(&e.op)
	}
}

// changedLocked wakes e's followers.
func (o *operations) changedLocked(e *opEntry) {
	close(e.changed)
	e.changed = make(chan struct{})
}

// message adds a progress line.
func (o *operations) message(id, msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.ops[id]
	if e == nil || e.op.Terminal() {
		return
	}
	e.op.Progress = append(e.op.Progress, msg)
	if n := len(e.op.Progress); n > maxProgressLines {
		e.op.Progress = append([]string(nil), e.op.Progress[n-maxProgressLines:]...)
	}
	e.seq++
	e.op.Updated = time.Now().UTC()
	o.changedLocked(e)
}

// cancel asks a running operation's work to stop with cause; it returns
// the operation as it is now.
func (o *operations) cancel(id string, cause error) (apiv1.Operation, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.ops[id]
	switch {
	case e == nil:
		return apiv1.Operation{}, errNoOperation(id)
	case e.op.Terminal():
		return cloneOp(e.op), fmt.Errorf("operation %s already %s: nothing to cancel: %w", id, e.op.State, errdefs.ErrFailedPrecondition)
	case e.cancel == nil:
		return cloneOp(e.op), fmt.Errorf("operation %s (%s) cannot be cancelled: %w", id, e.op.Kind, errdefs.ErrFailedPrecondition)
	}
	if !e.op.CancelRequested {
		e.op.CancelRequested = true
		e.op.Updated = time.Now().UTC()
		e.cancel(cause)
		o.changedLocked(e)
	}
	return cloneOp(e.op), nil
}

// get returns a copy, safe to encode while the operation runs.
func (o *operations) get(id string) (apiv1.Operation, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.ops[id]
	if e == nil {
		return apiv1.Operation{}, false
	}
	return cloneOp(e.op), true
}

func (o *operations) list() []apiv1.Operation {
	o.mu.Lock()
	out := make([]apiv1.Operation, 0, len(o.ops))
	for _, e := range o.ops {
		out = append(out, cloneOp(e.op))
	}
	o.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// follow sends id's events to send: its current state first, then each
// progress line and byte count as it comes, then its terminal state (an
// operation already finished is one state event). It returns when the
// operation ends, ctx ends, or send fails.
func (o *operations) follow(ctx context.Context, id string, send func(apiv1.OperationEvent) error) error {
	sent := -1 // progress lines sent, by seq; -1 before the first state
	var bytesSent [2]int64
	for {
		o.mu.Lock()
		e := o.ops[id]
		if e == nil {
			o.mu.Unlock()
			return errNoOperation(id)
		}
		op, seq, changed := cloneOp(e.op), e.seq, e.changed
		o.mu.Unlock()
		if sent < 0 {
			if err := send(apiv1.OperationEvent{Type: apiv1.OpEventState, Operation: &op}); err != nil {
				return err
			}
			sent, bytesSent = seq, [2]int64{op.DoneBytes, op.TotalBytes}
			if op.Terminal() {
				return nil
			}
		}
		if n := seq - sent; n > 0 {
			lines := op.Progress[max(0, len(op.Progress)-n):]
			for _, l := range lines {
				if err := send(apiv1.OperationEvent{Type: apiv1.OpEventProgress, Message: l}); err != nil {
					return err
				}
			}
			sent = seq
		}
		if b := [2]int64{op.DoneBytes, op.TotalBytes}; b != bytesSent {
			if err := send(apiv1.OperationEvent{Type: apiv1.OpEventProgress, DoneBytes: b[0], TotalBytes: b[1]}); err != nil {
				return err
			}
			bytesSent = b
		}
		if op.Terminal() {
			return send(apiv1.OperationEvent{Type: apiv1.OpEventState, Operation: &op})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// wait returns id once it has ended, or ctx's error.
func (o *operations) wait(ctx context.Context, id string) (apiv1.Operation, error) {
	var last apiv1.Operation
	err := o.follow(ctx, id, func(ev apiv1.OperationEvent) error {
		if ev.Operation != nil {
			last = *ev.Operation
		}
		return nil
	})
	return last, err
}

// cloneOp copies op so it can be encoded while the operation runs.
func cloneOp(op apiv1.Operation) apiv1.Operation {
	op.Progress = append([]string{}, op.Progress...)
	return op
}
