package egress

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/forkd-dev/forkd/internal/netns"
)

// An ended sandbox's uplink is not deleted by forkd: deleting a device
// waits out an RCU grace period under the host-wide RTNL lock (about
// 30 ms a sandbox here), while the kernel deletes the devices of every
// dying namespace in one batch once the namespace's last holder is gone.
// Its address stays taken until the host end is gone (a new sandbox given
// it earlier would share a route with the dying one); a drain watches for
// that and hands the address back to the pool.
const (
	// drainPoll is how often the drain looks while links are draining
	// (a namespace's cleanup takes a few milliseconds to a few tens).
	drainPoll = 20 * time.Millisecond
	// drainTimeout is how long an uplink may outlive its sandbox before
	// the drain deletes it itself: something still holds the namespace
	// (a proxied connection not yet closed, a VMM that did not exit).
	drainTimeout = 10 * time.Second
	// drainListAbove is the number of draining links above which one dump
	// of the host's links is cheaper than asking for each by name.
	drainListAbove = 32
	// allocateWait is how long an allocation from an exhausted pool waits
	// for draining links to come back before it fails.
	allocateWait = 30 * time.Second
)

// drain holds the links of ended sandboxes until their uplinks are gone.
type drain struct {
	pool    *Pool
	hostNS  string
	log     *slog.Logger
	timeout time.Duration // drainTimeout

	mu      sync.Mutex
	links   map[string]drainingLink // by host link name
	changed *sync.Cond              // links shrank, or the drain stopped
	running bool
	stopped bool
}

type drainingLink struct {
	link  Link
	since time.Time
}

func newDrain(pool *Pool, hostNS string, log *slog.Logger) *drain {
	d := &drain{pool: pool, hostNS: hostNS, log: log, timeout: drainTimeout, links: map[string]drainingLink{}}
	d.changed = sync.NewCond(&d.mu)
	return d
}

// add holds l until the uplink named hostName is gone.
func (d *drain) add(hostName string, l Link) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		// No watcher any more (the engine is closing): the address is
		// only memory, and the next process reads the host's links.
		return
	}
	d.links[hostName] = drainingLink{link: l, since: time.Now()}
	if !d.running {
		d.running = true
		go d.run()
	}
}

// pending is the number of links draining.
func (d *drain) pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.links)
}

// wait blocks until a draining link came back, none is draining, or
// timeout passed; it reports whether any came back.
func (d *drain) wait(timeout time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.links)
	if n == 0 || d.stopped {
		return false
	}
	t := time.AfterFunc(timeout, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.changed.Broadcast()
	})
	defer t.Stop()
	deadline := time.Now().Add(timeout)
	for len(d.links) >= n && !d.stopped && time.Now().Before(deadline) {
		d.changed.Wait()
	}
	return len(d.links) < n
}

// stop ends the watcher; links still draining stay taken.
func (d *drain) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	d.changed.Broadcast()
}

// run watches the draining links until none is left or the drain stops.
func (d *drain) run() {
	for {
		d.mu.Lock()
		if len(d.links) == 0 || d.stopped {
			d.running = false
			d.mu.Unlock()
			return
		}
		names := make([]string, 0, len(d.links))
		for name := range d.links {
			names = append(names, name)
		}
		d.mu.Unlock()

		gone, err := d.gone(names)
		if err != nil {
			d.log.Warn("watching ended sandboxes' uplinks", "err", err)
		}
		d.mu.Lock()
		for _, name := range names {
			dl, ok := d.links[name]
			if !ok {
				continue
			}
			if !gone[name] && time.Since(dl.since) < d.timeout {
				continue
			}
			if !gone[name] {
				// Still held after the timeout: delete it now.
				if err := netns.RemoveUplink(d.hostNS, name); err != nil {
					d.log.Warn("deleting an ended sandbox's uplink", "link", name, "err", err)
					continue
				}
			}
			delete(d.links, name)
			d.pool.Release(dl.link)
			d.changed.Broadcast()
		}
		d.mu.Unlock()
		time.Sleep(drainPoll)
	}
}

// gone reports which of names no longer exist in the host namespace.
func (d *drain) gone(names []string) (map[string]bool, error) {
	h, err := netns.RouteHandle(d.hostNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	out := make(map[string]bool, len(names))
	if len(names) > drainListAbove {
		links, err := h.LinkList()
		if err != nil {
			return nil, err
		}
		present := make(map[string]bool, len(links))
		for _, l := range links {
			present[l.Attrs().Name] = true
		}
		for _, n := range names {
			out[n] = !present[n]
		}
		return out, nil
	}
	for _, n := range names {
		_, err := h.LinkByName(n)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			out[n] = true
		case err != nil:
			return out, err
		}
	}
	return out, nil
}
