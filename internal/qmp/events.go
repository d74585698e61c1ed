package qmp

import "sync"

// Subscription receives the events that match its filter, in order.
type Subscription struct {
	s *subscription
}

type subscription struct {
	c      *Client
	filter func(Event) bool
	// mu guards the fields below.
	mu     sync.Mutex
	queue  []Event
	closed bool
	signal chan struct{} // capacity 1: "queue changed"
	out    chan Event
	quit   chan struct{}
}

// Subscribe delivers the events for which filter returns true (all events
// if filter is nil) on the returned subscription's channel, starting now.
// Delivery never blocks the client: events queue in memory until read.
// The channel is closed when the subscription is cancelled or the
// connection ends (after the queued events were delivered).
func (c *Client) Subscribe(filter func(Event) bool) *Subscription {
	s := &subscription{
		c:      c,
		filter: filter,
		signal: make(chan struct{}, 1),
		out:    make(chan Event),
		quit:   make(chan struct{}),
	}
	c.mu.Lock()
	if c.readErr != nil || c.closed {
		s.closed = true
	} else {
		c.subs[s] = struct{}{}
	}
	c.mu.Unlock()
	go s.pump()
	return &Subscription{s}
}

// SubscribeNames is Subscribe for events with one of the given names.
func (c *Client) SubscribeNames(names ...string) *Subscription {
	return c.Subscribe(func(e Event) bool {
		for _, n := range names {
			if e.Name == n {
				return true
			}
		}
		return false
	})
}

// C returns the channel the events arrive on.
func (s *Subscription) C() <-chan Event { return s.s.out }

// Cancel stops the subscription and closes its channel; queued events are
// dropped. It is safe to call more than once.
func (s *Subscription) Cancel() {
	c := s.s.c
	c.mu.Lock()
	delete(c.subs, s.s)
	c.mu.Unlock()
	s.s.mu.Lock()
	select {
	case <-s.s.quit:
	default:
		close(s.s.quit)
	}
	s.s.mu.Unlock()
}

// publish hands ev to every matching subscriber without blocking.
func (c *Client) publish(ev Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.subs {
		if s.filter != nil && !s.filter(ev) {
			continue
		}
		s.mu.Lock()
		s.queue = append(s.queue, ev)
		s.mu.Unlock()
		s.notify()
	}
}

// closeLocked ends delivery after the queued events; c.mu is held.
func (s *subscription) closeLocked() {
	delete(s.c.subs, s)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.notify()
}

func (s *subscription) notify() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// pump moves queued events to the unbuffered output channel.
func (s *subscription) pump() {
	defer close(s.out)
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			select {
			case <-s.signal:
				continue
			case <-s.quit:
				return
			}
		}
		ev := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		select {
		case s.out <- ev:
		case <-s.quit:
			return
		}
	}
}
