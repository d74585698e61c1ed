package uffd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Options tune a Server.
type Options struct {
	// Prefetch, when set, is copied in while faults are served, in order.
	// Offsets outside every region are skipped.
	Prefetch *WorkingSet
	// RecordWorkingSet keeps the offsets of faulted pages in the order of
	// their first fault, for WorkingSet. Pages that prefetch put in place
	// never fault, so record from a run without prefetch.
	RecordWorkingSet bool
	// HandshakeTimeout bounds the wait for the VMM to connect and send
	// its userfaultfd (default 30s), as Firecracker's docs advise.
	HandshakeTimeout time.Duration
	// BusyPoll, when positive, keeps the event loop reading the
	// userfaultfd (non-blocking, yielding the CPU between reads) for this
	// long after the last event before it sleeps in poll(2): a fault that
	// arrives meanwhile is read without the cost of waking the server's
	// thread, at the cost of a CPU kept busy while faults keep coming. 0
	// sleeps at once (the default).
	BusyPoll time.Duration
	// FaultAround, when above 1, answers a fault with up to this many
	// pages (at most MaxFaultAround) in one UFFDIO_COPY: the faulting
	// page and the ones after it in its region, up to the first one that
	// is removed, reads as zeros or is already present. Pages installed
	// so never fault (they count in Stats.FaultAround, not Faults). Only
	// for regions of the host's page size; ignored with RecordWorkingSet,
	// which must see every page fault.
	FaultAround int
	// Logger gets the server's events (default: discarded).
	Logger *slog.Logger
}

// Stats count what a server did.
type Stats struct {
	Faults     uint64 // missing-page faults read
	Copied     uint64 // pages installed with UFFDIO_COPY (faults and prefetch)
	Zeroed     uint64 // pages installed as zeros
	Exists     uint64 // pages already present (a race with prefetch or another fault)
	Retries    uint64 // copies refused with EAGAIN while the VMM changed its mappings
	Removes    uint64 // UFFD_EVENT_REMOVE and UFFD_EVENT_UNMAP events
	Prefetched uint64 // working-set pages prefetch installed
	// FaultAround counts the pages installed after a faulting one
	// (Options.FaultAround); they are in Copied too.
	FaultAround uint64
}

// Server serves one VMM's guest memory from a Chain. Create it with
// NewServer, run it once with Serve or ServeConn.
type Server struct {
	chain *Chain
	opts  Options
	log   *slog.Logger

	faults, copied, zeroed, exists, retries, removes, prefetched, around atomic.Uint64

	// wsMu guards ws.
	wsMu sync.Mutex
	ws   []uint64
}

// NewServer returns a server of chain's memory. The chain stays the
// caller's to close, after the server returned.
func NewServer(chain *Chain, opts Options) *Server {
	if opts.RecordWorkingSet || opts.FaultAround < 2 {
		opts.FaultAround = 0
	}
	opts.FaultAround = min(opts.FaultAround, MaxFaultAround)
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 30 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{chain: chain, opts: opts, log: log}
}

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	return Stats{
		Faults: s.faults.Load(), Copied: s.copied.Load(), Zeroed: s.zeroed.Load(), Exists: s.exists.Load(),
		Retries: s.retries.Load(), Removes: s.removes.Load(), Prefetched: s.prefetched.Load(),
		FaultAround: s.around.Load(),
	}
}

// WorkingSet returns the pages faulted so far (Options.RecordWorkingSet),
// in the order of their first fault.
func (s *Server) WorkingSet() *WorkingSet {
	s.wsMu.Lock()
	defer s.wsMu.Unlock()
	return &WorkingSet{PageSize: uint64(os.Getpagesize()), Offsets: append([]uint64(nil), s.ws...)}
}

// Serve accepts one connection on ln (the VMM's) and serves it as
// ServeConn does. It does not close ln.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	if err := ln.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout)); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { ln.SetDeadline(time.Unix(1, 0)) })
	conn, err := ln.AcceptUnix()
	stop()
	ln.SetDeadline(time.Time{})
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("uffd: wait %v for the VMM to connect to %s: %w", s.opts.HandshakeTimeout, ln.Addr(), err)
	}
	return s.ServeConn(ctx, conn)
}

// ServeConn receives the userfaultfd and regions on conn and serves
// faults until ctx ends (nil then), the VMM's memory is gone, or an error.
// Bad regions are refused (an error wrapping errdefs.ErrInvalidArgument)
// before anything is served. It closes conn and the userfaultfd.
func (s *Server) ServeConn(ctx context.Context, conn *net.UnixConn) error {
	fd, ms, err := receive(conn, s.chain.Size(), s.opts.HandshakeTimeout)
	conn.Close()
	if err != nil {
		return err
	}
	sess, err := s.newSession(fd, ms)
	if err != nil {
		unix.Close(fd)
		return err
	}
	defer unix.Close(fd)
	s.log.Debug("uffd: serving", "regions", len(ms), "memory_bytes", s.chain.Size(), "chain_depth", s.chain.Depth())
	var wg sync.WaitGroup
	pctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
	}()
	if ws := s.opts.Prefetch; ws != nil && len(ws.Offsets) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess.prefetch(pctx, ws)
		}()
	}
	return sess.loop(ctx)
}

// session is one VMM's userfaultfd and regions.
type session struct {
	s  *Server
	fd int // the userfaultfd, non-blocking

	// mu is held for writing while events are read and removed ranges
	// marked, and for reading by prefetch around each check-and-copy: so
	// prefetch never installs a page from the snapshot after the event
	// that removed it was read (see prefetchPage).
	mu      sync.RWMutex
	regions []*region // sorted by address
}

// region is a Mapping and its per-page state, one bit a page.
type region struct {
	Mapping
	removed bitmap // guarded by session.mu
	seen    bitmap // pages recorded; the event loop's only
}

// newSession takes over fd, the userfaultfd.
func (s *Server) newSession(fd int, ms []Mapping) (*session, error) {
	// Firecracker creates the userfaultfd non-blocking; poll(2) on a
	// blocking one reports an error, so make sure.
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("uffd: make the userfaultfd non-blocking: %w", err)
	}
	sess := &session{s: s, fd: fd}
	for _, m := range ms {
		r := &region{Mapping: m, removed: newBitmap(m.Size / m.PageSize)}
		if s.opts.RecordWorkingSet {
			r.seen = newBitmap(m.Size / m.PageSize)
		}
		sess.regions = append(sess.regions, r)
	}
	sort.Slice(sess.regions, func(i, j int) bool { return sess.regions[i].BaseHostVirtAddr < sess.regions[j].BaseHostVirtAddr })
	return sess, nil
}

// find returns the region holding host address addr and the index of its
// page there.
func (sess *session) find(addr uint64) (*region, uint64, bool) {
	rs := sess.regions
	i := sort.Search(len(rs), func(i int) bool { return rs[i].end() > addr })
	if i == len(rs) || rs[i].BaseHostVirtAddr > addr {
		return nil, 0, false
	}
	return rs[i], (addr - rs[i].BaseHostVirtAddr) / rs[i].PageSize, true
}

// retryWait is how long the loop waits for events before retrying faults
// that a copy refused with EAGAIN.
const retryWait = time.Millisecond

// loop reads events and serves them until ctx ends or the VMM is gone.
// It runs on a thread of its own, blocked in poll(2) on the userfaultfd
// and an eventfd that ctx's end writes: a fault's round trip then costs
// no goroutine hand-off.
func (sess *session) loop(ctx context.Context) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("uffd: eventfd: %w", err)
	}
	defer unix.Close(efd)
	var stopped atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		stopped.Store(true)
		unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	})
	defer stop()
	spin := sess.s.opts.BusyPoll
	buf := make([]byte, 64*msgSize)
	page := make([]byte, max(sess.maxPageSize(), uint64(sess.s.opts.FaultAround)*uint64(os.Getpagesize())))
	fds := make([]unix.PollFd, 2)
	var pending, faults []uint64 // fault addresses to retry, read
	var last time.Time           // when events were last read
	// readFirst: read before polling, for events are likely pending (the
	// last read filled buf) or busy-polling; else poll first, sparing a
	// read that finds nothing.
	readFirst := true
	for {
		if stopped.Load() {
			return nil
		}
		var n int
		if readFirst {
			if n, err = sess.readEvents(buf); err != nil {
				return err
			}
		}
		if n == 0 {
			if spin > 0 && len(pending) == 0 && time.Since(last) < spin {
				// Let a thread waiting for this CPU (a vCPU) run.
				unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				continue
			}
			// With faults pending, wait for events only briefly: the
			// change that made the copy fail may complete without
			// another event.
			timeout := -1
			if len(pending) > 0 {
				timeout = int(retryWait / time.Millisecond)
			}
			fds[0] = unix.PollFd{Fd: int32(sess.fd), Events: unix.POLLIN}
			fds[1] = unix.PollFd{Fd: int32(efd), Events: unix.POLLIN}
			if _, err := unix.Poll(fds, timeout); err != nil && err != unix.EINTR {
				return fmt.Errorf("uffd: poll: %w", err)
			}
			if stopped.Load() || ctx.Err() != nil {
				return nil
			}
			if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				return fmt.Errorf("uffd: the userfaultfd reports an error (events %#x)", fds[0].Revents)
			}
			if n, err = sess.readEvents(buf); err != nil {
				return err
			}
		}
		readFirst = spin > 0 || n == len(buf)
		if n > 0 && spin > 0 {
			last = time.Now()
		}
		faults = faults[:0]
		for off := 0; off < n; off += msgSize {
			m := decodeMsg(buf[off : off+msgSize])
			if m.event == eventPagefault {
				sess.s.faults.Add(1)
				faults = append(faults, m.addr)
			}
		}
		retry := pending
		pending = nil
		for _, addrs := range [][]uint64{retry, faults} {
			for _, addr := range addrs {
				again, err := sess.serveFault(addr, page)
				if err != nil {
					return err
				}
				if again {
					pending = append(pending, addr)
				}
			}
		}
	}
}

// readEvents reads a batch of events into buf and returns its length (0
// when there are none). It marks removed and unmapped ranges while it
// holds mu, so that prefetch sees them before it could copy into them
// (see session.mu).
func (sess *session) readEvents(buf []byte) (int, error) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	n, err := unix.Read(sess.fd, buf)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("uffd: read events: %w", err)
	case n%msgSize != 0:
		return 0, fmt.Errorf("uffd: read %d bytes of events, not a multiple of %d", n, msgSize)
	}
	sess.markRemoved(buf[:n])
	return n, nil
}

// markRemoved marks the pages of remove and unmap events in buf: a later
// fault there gets zeros, and prefetch leaves them alone.
func (sess *session) markRemoved(buf []byte) {
	for off := 0; off+msgSize <= len(buf); off += msgSize {
		m := decodeMsg(buf[off : off+msgSize])
		switch m.event {
		case eventPagefault:
		case eventRemove, eventUnmap:
			sess.s.removes.Add(1)
			for _, r := range sess.regions {
				lo, hi := max(m.addr, r.BaseHostVirtAddr), min(m.end, r.end())
				if lo >= hi {
					continue
				}
				first := (lo - r.BaseHostVirtAddr) / r.PageSize
				last := (hi - r.BaseHostVirtAddr + r.PageSize - 1) / r.PageSize
				r.removed.setRange(first, last)
			}
		default:
			// Fork and remap events are not asked for by Firecracker.
			sess.s.log.Warn("uffd: ignoring an event the server does not handle", "event", m.event)
		}
	}
}

// serveFault answers the fault at addr. It reports whether the copy must
// be retried (EAGAIN: the VMM's mappings are changing, and the event
// that says how is about to be read).
func (sess *session) serveFault(addr uint64, buf []byte) (again bool, err error) {
	r, idx, ok := sess.find(addr)
	if !ok {
		return false, fmt.Errorf("uffd: fault at %#x outside every region the VMM sent", addr)
	}
	if sess.s.opts.RecordWorkingSet && !r.seen.get(idx) {
		r.seen.set(idx)
		sess.s.wsMu.Lock()
		sess.s.ws = append(sess.s.ws, r.Offset+idx*r.PageSize)
		sess.s.wsMu.Unlock()
	}
	// The event loop is the only writer of removed: no lock to read it.
	if done, err := sess.faultAround(r, idx, buf); done || err != nil {
		return false, err
	}
	_, err = sess.install(r, idx, buf, r.removed.get(idx))
	switch {
	case errors.Is(err, unix.EAGAIN):
		sess.s.retries.Add(1)
		return true, nil
	case errors.Is(err, unix.ESRCH):
		return false, fmt.Errorf("uffd: the VMM's memory is gone (it exited?): %w", err)
	case errors.Is(err, unix.ENOENT):
		// Unmapped meanwhile: nobody waits on it any more.
		return false, nil
	}
	return false, err
}

// install puts page idx of r in place: zeros when zero is set or the
// chain holds zeros there, else the chain's bytes. A page already present
// counts as done (present), and its waiters are woken.
func (sess *session) install(r *region, idx uint64, buf []byte, zero bool) (present bool, err error) {
	dst := r.BaseHostVirtAddr + idx*r.PageSize
	page := buf[:r.PageSize]
	if !zero {
		if zero, err = sess.s.chain.ReadAt(page, r.Offset+idx*r.PageSize); err != nil {
			return false, err
		}
	}
	switch {
	case zero && r.PageSize == uint64(os.Getpagesize()):
		err = zeroPage(sess.fd, dst, r.PageSize)
	case zero:
		// hugetlb has no UFFDIO_ZEROPAGE: copy zeros.
		clear(page)
		err = copyPage(sess.fd, dst, page)
	default:
		err = copyPage(sess.fd, dst, page)
	}
	switch {
	case err == nil && zero:
		sess.s.zeroed.Add(1)
	case err == nil:
		sess.s.copied.Add(1)
	case errors.Is(err, unix.EEXIST):
		sess.s.exists.Add(1)
		if werr := wake(sess.fd, dst, r.PageSize); werr != nil && !errors.Is(werr, unix.ENOENT) {
			return true, fmt.Errorf("uffd: wake at %#x: %w", dst, werr)
		}
		return true, nil
	}
	return false, err
}

func (sess *session) maxPageSize() uint64 {
	var ps uint64
	for _, r := range sess.regions {
		ps = max(ps, r.PageSize)
	}
	return ps
}
