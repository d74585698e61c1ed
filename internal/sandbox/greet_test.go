package sandbox

import (
	"context"
	"testing"
	"time"
)

// A guest that answers its HELLO late set its clock to the HELLO's: the
// engine then sends a fresh identity, stamped after the answer, so the
// child's clock is the host's (TestForkMinimal once saw a guest 9 s
// behind on a loaded host). A prompt answer costs no extra call.
func TestClockSetAfterSlowHandshake(t *testing.T) {
	d := &fakeDriver{helloDelay: 50 * time.Millisecond}
	e, _ := newFakeEngineWith(t, d, 0, nil)
	e.clockSlack = time.Hour
	if _, err := e.Fork(context.Background(), "base", 1); err != nil {
		t.Fatal(err)
	}
	if n := d.identities.Load(); n != 0 {
		t.Fatalf("a prompt handshake was followed by %d identity calls, want 0", n)
	}

	e.clockSlack = 10 * time.Millisecond
	if _, err := e.Fork(context.Background(), "base", 1); err != nil {
		t.Fatal(err)
	}
	if n := d.identities.Load(); n != 1 {
		t.Fatalf("a slow handshake was followed by %d identity calls, want 1", n)
	}
	if clock, answered := d.clock.Load(), d.helloAnswered.Load(); clock < answered {
		t.Fatalf("the guest's clock was last set to %s, before it answered its HELLO at %s",
			time.Unix(0, clock).Format(time.RFC3339Nano), time.Unix(0, answered).Format(time.RFC3339Nano))
	}
}
