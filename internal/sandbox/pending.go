package sandbox

// Branches written in the background (BranchOptions.NoWait). The tag is
// visible at once in state "writing", becomes a committed snapshot
// ("ready") when the branch succeeds, or "failed" with the reason. Only a
// committed snapshot can be forked. Pending tags live in memory only: the
// snapshot store commits atomically, so after a daemon crash a branch that
// was being written is simply absent (its staging directory is removed
// when the store opens), never a torn "ready" tag.

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Pending tag states.
const (
	PendingWriting = "writing"
	PendingFailed  = "failed"
)

// maxFailedKept bounds the failed branches remembered for clients to see.
const maxFailedKept = 64

// asyncBranchTimeout bounds a background branch (it has no client
// waiting to cancel it).
const asyncBranchTimeout = 10 * time.Minute

// PendingSnapshot is a tag a background branch is writing, or failed to.
type PendingSnapshot struct {
	Tag       string
	Mode      string
	SandboxID string
	Started   time.Time
	State     string // PendingWriting or PendingFailed
	Err       error  // why it failed
}

// Pending returns the pending entry for tag, if any.
func (e *Engine) Pending(tag string) (PendingSnapshot, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.pending[tag]
	if !ok {
		return PendingSnapshot{}, false
	}
	return *p, true
}

// PendingList returns the pending tags, sorted.
func (e *Engine) PendingList() []PendingSnapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]PendingSnapshot, 0, len(e.pending))
	for _, p := range e.pending {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out
}

// pendingErr explains why tag cannot be used yet (nil if it is not
// pending).
func (e *Engine) pendingErr(tag string) error {
	p, ok := e.Pending(tag)
	switch {
	case !ok:
		return nil
	case p.State == PendingWriting:
		return fmt.Errorf("snapshot %q is still being written (a %s branch of sandbox %s started %v ago); poll it until its state is ready: %w",
			tag, p.Mode, p.SandboxID, time.Since(p.Started).Round(time.Millisecond), errdefs.ErrFailedPrecondition)
	default:
		return fmt.Errorf("snapshot %q failed: %v (remove it with `forkd rmi %s` to reuse the tag): %w", tag, p.Err, tag, errdefs.ErrFailedPrecondition)
	}
}

// BranchAsync starts a branch in the background and returns at once with
// the tag in state writing. What can be checked up front (tag, mode, the
// sandbox runs) is, so bad input still fails here. The branch is
// daemon-owned work (Go): ctx only cancels it (an operation's cancel),
// and a cancelled branch leaves no tag, not even a failed one. done, if
// set, is told the outcome after the tag is committed or marked failed.
func (e *Engine) BranchAsync(ctx context.Context, id string, opts BranchOptions, done func(*BranchResult, error)) (PendingSnapshot, error) {
	if opts.Mode == "" {
		opts.Mode = BranchDiff
	}
	if err := e.checkBranch(id, &opts); err != nil {
		return PendingSnapshot{}, err
	}
	tenant := e.eventTenant(id, opts)
	p := &PendingSnapshot{Tag: opts.Tag, Mode: opts.Mode, SandboxID: id, Started: time.Now(), State: PendingWriting}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return PendingSnapshot{}, fmt.Errorf("the engine is shutting down: %w", errdefs.ErrUnavailable)
	}
	if _, ok := e.pending[opts.Tag]; ok {
		e.mu.Unlock()
		return PendingSnapshot{}, fmt.Errorf("snapshot %q already exists (pending): %w", opts.Tag, errdefs.ErrAlreadyExists)
	}
	e.pending[opts.Tag] = p
	// What is returned is copied under mu: the branch below may fail,
	// and mark p failed, before this function returns.
	ret := *p
	e.mu.Unlock()
	err := e.Go(ctx, func(ctx context.Context) {
		bctx, cancel := context.WithTimeout(ctx, asyncBranchTimeout)
		defer cancel()
		res, err := e.branch(bctx, id, opts)
		cancelled := err != nil && ctx.Err() != nil
		e.mu.Lock()
		switch {
		case err == nil, cancelled:
			delete(e.pending, opts.Tag)
		default:
			e.log.Warn("background branch failed", "sandbox_id", id, "tag", opts.Tag, "mode", opts.Mode, "err", err)
			p.State, p.Err = PendingFailed, err
			e.pruneFailedLocked()
		}
		e.mu.Unlock()
		// Told outside mu: the listener (the audit log) may take its time.
		ev := Event{Kind: EventBranchReady, SandboxID: id, Tag: opts.Tag, Tenant: tenant, Reason: string(opts.Mode)}
		if err != nil {
			ev.Kind, ev.Err = EventBranchFailed, err
		}
		e.emit(ev)
		if done != nil {
			done(res, err)
		}
	})
	if err != nil {
		e.mu.Lock()
		delete(e.pending, opts.Tag)
		e.mu.Unlock()
		return PendingSnapshot{}, err
	}
	return ret, nil
}

// pruneFailedLocked forgets the oldest failed branches beyond
// maxFailedKept.
func (e *Engine) pruneFailedLocked() {
	var failed []*PendingSnapshot
	for _, p := range e.pending {
		if p.State == PendingFailed {
			failed = append(failed, p)
		}
	}
	if len(failed) <= maxFailedKept {
		return
	}
	sort.Slice(failed, func(i, j int) bool { return failed[i].Started.Before(failed[j].Started) })
	for _, p := range failed[:len(failed)-maxFailedKept] {
		delete(e.pending, p.Tag)
	}
}

// forgetFailed removes a failed pending tag (rmi of a failed branch). A
// tag still being written cannot be removed.
func (e *Engine) forgetFailed(tag string) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.pending[tag]
	if !ok {
		return false, nil
	}
	if p.State == PendingWriting {
		return false, fmt.Errorf("snapshot %q is still being written; remove it once it is ready or failed: %w", tag, errdefs.ErrFailedPrecondition)
	}
	delete(e.pending, tag)
	return true, nil
}
