package agentconn

import (
	"io"
	"log"
	"time"

	"github.com/hashicorp/yamux"
)

// streamWindow is the per-stream receive window of both sides: 4x yamux's
// 256 KiB default, so a stream keeps more in flight per round trip. It is
// also what a stream may buffer in the guest when its handler reads slowly
// (64 busy streams = 64 MiB), and it bounds every data frame, which the
// agent's frame tracker checks. Under TCG the transport is CPU bound
// (~40 MiB/s up, ~50 MiB/s down for 32 MiB files); 4 MiB windows were no
// faster.
const streamWindow = 1 << 20

// yamuxConfig is the configuration both sides use. Keep-alive is off: the
// agent must not write on its own (a paused or snapshotted VM would see
// "timeouts" that are not real), and the host learns of a dead VM from its
// VMM, not from pings.
func yamuxConfig(logf func(string, ...any)) *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.MaxStreamWindowSize = streamWindow
	// Emulated guests (TCG) can be slow to drain a write; a stalled write
	// is more likely a busy guest than a dead one.
	c.ConnectionWriteTimeout = 60 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.StreamCloseTimeout = time.Minute
	c.LogOutput = nil
	c.Logger = log.New(logWriter(logf), "yamux: ", 0)
	return c
}

// logWriter adapts a printf-style function to the io.Writer that
// log.Logger wants.
type logWriter func(string, ...any)

func (f logWriter) Write(p []byte) (int, error) {
	if f != nil {
		f("%s", trimNL(p))
	}
	return len(p), nil
}

func trimNL(p []byte) string {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		p = p[:n-1]
	}
	return string(p)
}

var _ io.Writer = logWriter(nil)
