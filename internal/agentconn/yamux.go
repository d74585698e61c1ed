package agentconn

import (
	"io"
	"log"
	"sync"
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

// Host-side yamux logging: the guest makes yamux log (a frame on a stream
// it was refused, a bad header), one line per frame, so a hostile guest
// could fill the daemon's log. A session logs at most logBurst lines per
// logInterval and then says how many it dropped.
const (
	logBurst    = 10
	logInterval = time.Minute
)

// logLimiter passes at most burst lines per interval on to logf.
type logLimiter struct {
	logf     func(string, ...any)
	burst    int
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	start   time.Time
	n       int
	dropped int
}

func newLogLimiter(logf func(string, ...any)) *logLimiter {
	return &logLimiter{logf: logf, burst: logBurst, interval: logInterval, now: time.Now}
}

func (l *logLimiter) printf(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := l.now(); now.Sub(l.start) >= l.interval {
		if l.dropped > 0 {
			l.logf("yamux: %d more messages in the last %v dropped (a guest sending bad frames?)", l.dropped, l.interval)
		}
		l.start, l.n, l.dropped = now, 0, 0
	}
	if l.n >= l.burst {
		l.dropped++
		return
	}
	l.n++
	l.logf(f, a...)
}
