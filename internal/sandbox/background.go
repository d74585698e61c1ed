package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// ErrEngineClosed is the cause of the engine's lifetime context once
// Close gave up waiting for daemon-owned work.
var ErrEngineClosed = fmt.Errorf("the daemon is shutting down: %w", errdefs.ErrUnavailable)

// closeCancelGrace is how long Close waits, after cancelling daemon-owned
// work, for it to unwind (remove its staging directories).
const closeCancelGrace = 5 * time.Second

// Go runs fn as daemon-owned work: on a context derived from the engine's
// lifetime (not a request's), so a client that goes away does not cancel
// it. ctx, if its own cancellation should stop the work (an operation's
// cancel), is joined: fn's context ends when either does. Close waits for
// fn (until its deadline, then cancels the work). Once the engine is
// closing, Go refuses with ErrUnavailable and fn does not run.
func (e *Engine) Go(ctx context.Context, fn func(ctx context.Context)) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return fmt.Errorf("the engine is shutting down: %w", errdefs.ErrUnavailable)
	}
	// Added under mu, where Close sets closed before it waits: no Add can
	// race that Wait.
	e.bg.Add(1)
	e.mu.Unlock()
	wctx, cancel := context.WithCancelCause(e.life)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	go func() {
		defer e.bg.Done()
		defer cancel(nil)
		defer stop()
		fn(wctx)
	}()
	return nil
}

// discardLater stops pv on its own goroutine, for callers that hold a
// pool's lock or must not wait for a teardown; Close waits for it.
func (e *Engine) discardLater(pv *prepared) {
	e.discards.add()
	go func() {
		defer e.discards.done()
		pv.discard(context.Background())
	}()
}

// discardTracker counts discards in flight. Unlike a WaitGroup it may be
// added to while wait runs (a pool handing back a VMM as Close waits),
// and wait gives up with ctx. Its lock is a leaf: add is called under
// pool and engine locks.
type discardTracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (t *discardTracker) add() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
}

func (t *discardTracker) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 {
		close(t.idle)
		t.idle = nil
	}
}

func (t *discardTracker) pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// wait returns once no discard is in flight, or with ctx's error.
func (t *discardTracker) wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		idle := t.idle
		t.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
