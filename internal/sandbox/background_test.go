package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestGoOutlivesItsCallerUntilClose: work started with Go ends when the
// context it was given is cancelled (an operation's cancel), with that
// cause; Close waits for running work until its deadline, then cancels it
// with ErrEngineClosed and waits for it to unwind; a closed engine refuses
// new work.
func TestGoOutlivesItsCallerUntilClose(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)

	// Cancelled through the context it was given.
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("operation cancelled")
	ended := make(chan error, 1)
	if err := e.Go(ctx, func(ctx context.Context) { <-ctx.Done(); ended <- context.Cause(ctx) }); err != nil {
		t.Fatal(err)
	}
	cancel(cause)
	if got := <-ended; !errors.Is(got, cause) {
		t.Fatalf("cancelled work saw cause %v, want %v", got, cause)
	}

	// Running at Close: waited for until Close's deadline, then cancelled.
	started := make(chan struct{})
	if err := e.Go(context.Background(), func(ctx context.Context) { close(started); <-ctx.Done(); ended <- context.Cause(ctx) }); err != nil {
		t.Fatal(err)
	}
	<-started
	cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer ccancel()
	e.Close(cctx)
	select {
	case got := <-ended:
		if !errors.Is(got, ErrEngineClosed) {
			t.Fatalf("work cancelled by Close saw %v, want ErrEngineClosed", got)
		}
	default:
		t.Fatal("Close returned before the work it cancelled ended")
	}
	if err := e.Go(context.Background(), func(context.Context) { t.Error("work ran on a closed engine") }); !errdefs.IsUnavailable(err) {
		t.Fatalf("Go on a closed engine: %v, want unavailable", err)
	}
}
