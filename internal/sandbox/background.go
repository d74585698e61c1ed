package sandbox

import (
	"context"
	"fmt"
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
