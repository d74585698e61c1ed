package sandbox

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn"
)

// defaultClockSlack is how long a handshake may take before the guest's clock is
// set again: the HELLO carries the host's clock as of writing it, and the
// agent sets the guest's clock to that when it reads it.
const defaultClockSlack = time.Second

// greetAgent does the handshake with a VM's agent, giving the VM its
// identity. A guest that answers late (a loaded host, a handshake
// resync) has set a clock as old as the HELLO it read; it is sent a fresh
// identity at once, so every VM starts within moments of the host's clock.
func (e *Engine) greetAgent(ctx context.Context, conn net.Conn, id string) (*agentconn.Session, agentapi.Ready, error) {
	hello := agentapi.Hello{Identity: newIdentity(id)}
	sess, ready, err := agentconn.Dial(ctx, conn, hello)
	if err != nil {
		return nil, ready, err
	}
	if time.Since(time.Unix(0, hello.Identity.UnixNano)) <= e.clockSlack {
		return sess, ready, nil
	}
	if _, err := e.agentClient(sess).SetIdentity(ctx, newIdentity(id)); err != nil {
		sess.Close()
		return nil, ready, fmt.Errorf("setting the clock after a slow handshake: %w", err)
	}
	return sess, ready, nil
}
