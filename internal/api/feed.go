package api

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Bounds of the lifecycle event feed (GET /v1/events).
const (
	// feedBacklog is how many recent events the feed keeps for streams
	// that resume (Last-Event-ID) or start from an id (?since=).
	feedBacklog = 1024
	// feedBuffer is how far one stream may fall behind before it is cut:
	// a slow reader never slows the daemon, and it resumes where it was
	// with Last-Event-ID.
	feedBuffer = 256
	// maxFeedStreams bounds the event streams open at once, and
	// maxTenantFeedStreams those of one tenant's non-admin tokens, so
	// that no tenant can take them all.
	maxFeedStreams       = 256
	maxTenantFeedStreams = 32
)

// eventTypes are the types a stream may ask for (?type=), each also
// matched by its prefix ("sandbox." or "sandbox.*").
var eventTypes = []string{
	"sandbox.created", "sandbox.killed", "sandbox.expired", "sandbox.died", "sandbox.discarded",
	"snapshot.created", "snapshot.deleted", "snapshot.branch_ready", "snapshot.branch_failed",
	"operation.finished",
}

// feed fans lifecycle events out to the streams of GET /v1/events, each
// seeing what its principal may see. Publishing never blocks: a stream
// that falls feedBuffer events behind is cut and resumes from the
// backlog. Event ids carry the feed's epoch (the daemon's start), so a
// client resuming across a restart learns that it lost events instead of
// skipping the new daemon's first ones.
type feed struct {
	epoch string
	// closing ends when the feed closes (the HTTP server shuts down):
	// every stream the server holds open follows it (streamContext).
	closing context.Context
	shut    context.CancelFunc

	// mu guards the fields below.
	mu     sync.Mutex
	seq    uint64
	ring   []apiv1.Event // the newest events, oldest first; at most 2*feedBacklog
	subs   map[*feedSub]struct{}
	closed bool
}

// feedSub is one stream's subscription.
type feedSub struct {
	p     auth.Principal
	types []string
	ch    chan apiv1.Event
	// cut is closed when the stream fell behind or the feed closed.
	cut chan struct{}
}

func newFeed(now time.Time) *feed {
	ctx, cancel := context.WithCancel(context.Background())
	return &feed{epoch: strconv.FormatInt(now.UnixNano(), 36), subs: map[*feedSub]struct{}{}, closing: ctx, shut: cancel}
}

// id is an event's stream id: EPOCH.SEQ.
func (f *feed) id(seq uint64) string { return f.epoch + "." + strconv.FormatUint(seq, 10) }

// publish stamps ev with the next seq and the time, keeps it for
// resuming streams and hands it to every stream that may see it.
func (f *feed) publish(ev apiv1.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.seq++
	ev.Seq = f.seq
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	f.ring = append(f.ring, ev)
	if len(f.ring) > 2*feedBacklog {
		f.ring = append([]apiv1.Event(nil), f.ring[len(f.ring)-feedBacklog:]...)
	}
	for s := range f.subs {
		if !s.wants(ev) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			f.dropLocked(s)
		}
	}
}

// wants reports whether the stream asked for ev and may see it: its
// tenant's sandboxes and snapshots (an admin: all).
func (s *feedSub) wants(ev apiv1.Event) bool {
	if !s.p.Sees(ev.Tenant) {
		return false
	}
	if len(s.types) == 0 {
		return true
	}
	for _, t := range s.types {
		if ev.Type == t || (strings.HasSuffix(t, ".") && strings.HasPrefix(ev.Type, t)) {
			return true
		}
	}
	return false
}

// subscribe opens a stream for p. After, if not empty, is the id of the
// last event the client saw (Last-Event-ID, ?since=): the kept events
// after it come first, preceded by an events.lost event when some it
// missed are no longer kept (or were another daemon's).
func (f *feed) subscribe(p auth.Principal, types []string, after string) (*feedSub, []apiv1.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, nil, fmt.Errorf("the daemon is shutting down: %w", errdefs.ErrUnavailable)
	}
	if len(f.subs) >= maxFeedStreams {
		return nil, nil, fmt.Errorf("%d event streams are open, the most the daemon serves; close one: %w", maxFeedStreams, errdefs.ErrResourceExhausted)
	}
	if !p.Admin() {
		n := 0
		for s := range f.subs {
			if !s.p.Admin() && auth.TenantOf(s.p.Tenant) == auth.TenantOf(p.Tenant) {
				n++
			}
		}
		if n >= maxTenantFeedStreams {
			return nil, nil, fmt.Errorf("tenant %q has %d event streams open, the most one tenant may; close one: %w", auth.TenantOf(p.Tenant), n, errdefs.ErrResourceExhausted)
		}
	}
	s := &feedSub{p: p, types: types, ch: make(chan apiv1.Event, feedBuffer), cut: make(chan struct{})}
	var backlog []apiv1.Event
	if after != "" {
		kept := f.ring
		if len(kept) > feedBacklog {
			kept = kept[len(kept)-feedBacklog:]
		}
		from := uint64(0) // the last seq the client saw, in this epoch
		epoch, seqText, _ := strings.Cut(after, ".")
		n, err := strconv.ParseUint(seqText, 10, 64)
		if epoch == f.epoch && err == nil && n <= f.seq {
			from = n
		}
		oldest := f.seq + 1
		if len(kept) > 0 {
			oldest = kept[0].Seq
		}
		if from+1 < oldest || epoch != f.epoch {
			lost := apiv1.Event{Type: apiv1.EventsLost, Time: time.Now().UTC()}
			switch {
			case epoch != f.epoch:
				lost.Reason = "the daemon restarted since event " + after + ": events of the earlier daemon after it, if any, are gone; kept events of this one follow"
			default:
				lost.Reason = fmt.Sprintf("events %d to %d are no longer kept (the daemon keeps the last %d)", from+1, oldest-1, feedBacklog)
			}
			backlog = append(backlog, lost)
		}
		for _, ev := range kept {
			if ev.Seq > from && s.wants(ev) {
				backlog = append(backlog, ev)
			}
		}
	}
	f.subs[s] = struct{}{}
	return s, backlog, nil
}

// unsubscribe ends s (idempotent).
func (f *feed) unsubscribe(s *feedSub) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; ok {
		f.dropLocked(s)
	}
}

func (f *feed) dropLocked(s *feedSub) {
	delete(f.subs, s)
	close(s.cut)
}

// close cuts every stream and refuses new ones: an HTTP server's
// shutdown waits for its handlers, and a stream's would not end alone.
func (f *feed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.shut()
	for s := range f.subs {
		f.dropLocked(s)
	}
}

// parseEventTypes reads ?type= values (repeated or comma-separated): each
// a type of eventTypes, or a prefix of some ending in "." or ".*".
func parseEventTypes(values []string) ([]string, error) {
	var out []string
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			t = strings.TrimSuffix(t, "*")
			known := false
			for _, k := range eventTypes {
				if k == t || (strings.HasSuffix(t, ".") && strings.HasPrefix(k, t)) {
					known = true
					break
				}
			}
			if !known {
				return nil, fmt.Errorf("event type %q: want one of %s, or a prefix such as sandbox.*: %w", t, strings.Join(eventTypes, ", "), errdefs.ErrInvalidArgument)
			}
			out = append(out, t)
		}
	}
	return out, nil
}
