package pysession

import (
	"context"
	"fmt"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// rehearseGrace is how long past a rehearsal's timeout the session waits
// before it interrupts the runner itself: the runner kills the copy at
// the timeout, so an interrupt means the runner is stuck.
const rehearseGrace = 10 * time.Second

// Rehearse runs code in a throwaway copy of the session (the runner's
// "rehearse": it forks, the copy runs code as run_code would with its
// output discarded, and exits), so that a pooled child's emulator has
// translated the code a first request runs before there is one. The
// session's own state is untouched. A pending reseed is sent first, as
// before any request. The copy's failure (its code raised, or the runner
// killed it at timeout) is an InvalidArgument error and leaves the
// session as it was; timeout <= 0 means none.
func (s *Session) Rehearse(ctx context.Context, code string, timeout time.Duration) error {
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	if err := s.sendPendingSeed(ctx); err != nil {
		return err
	}
	var guard time.Duration
	if timeout > 0 {
		guard = timeout + rehearseGrace
	}
	r, _, err := s.call(ctx, map[string]any{"op": "rehearse", "code": code, "timeout_ms": timeout.Milliseconds()}, guard)
	s.stdout.take(true) // the copy's output went to /dev/null; the
	s.stderr.take(true) // runner's markers are all there is
	if err != nil {
		return err
	}
	if r.Error != nil {
		// The code's fault, not the session's: it is fine.
		return fmt.Errorf("rehearsal: %s: %s: %w", r.Error.Name, r.Error.Value, errdefs.ErrInvalidArgument)
	}
	return nil
}
