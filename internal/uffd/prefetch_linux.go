package uffd

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// prefetch installs the pages of ws, in order, while the event loop serves
// faults. A page already present (faulted first) is skipped by the kernel
// (EEXIST); a removed one is left alone; offsets outside every region are
// skipped. It stops at ctx's end or when the VMM's memory is gone.
func (sess *session) prefetch(ctx context.Context, ws *WorkingSet) {
	buf := make([]byte, sess.maxPageSize())
	for _, off := range ws.Offsets {
		if ctx.Err() != nil {
			return
		}
		r, idx, ok := sess.findOffset(off)
		if !ok {
			continue
		}
		err := sess.prefetchPage(ctx, r, idx, buf)
		switch {
		case err == nil:
		case errors.Is(err, unix.ESRCH), errors.Is(err, context.Canceled):
			return
		default:
			sess.s.log.Debug("uffd: prefetch skipped a page", "offset", off, "err", err)
		}
	}
}

// prefetchPage installs one page unless it was removed. The check and the
// copy happen under mu (read), which the event loop holds while it reads
// events and marks removed ranges: a copy either precedes the remove
// event's read (and the kernel's zap that follows clears it) or sees the
// mark. While the VMM's mappings change the copy fails with EAGAIN, and
// is retried once the event loop has read the event.
func (sess *session) prefetchPage(ctx context.Context, r *region, idx uint64, buf []byte) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		sess.mu.RLock()
		var err error
		if !r.removed.get(idx) {
			var present bool
			present, err = sess.install(r, idx, buf, false)
			if err == nil && !present {
				sess.s.prefetched.Add(1)
			}
		}
		sess.mu.RUnlock()
		if !errors.Is(err, unix.EAGAIN) {
			return err
		}
		sess.s.retries.Add(1)
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return context.Canceled
		case <-t.C:
		}
	}
}

// findOffset returns the region holding memory offset off and the index
// of its page there.
func (sess *session) findOffset(off uint64) (*region, uint64, bool) {
	for _, r := range sess.regions {
		if off >= r.Offset && off < r.Offset+r.Size {
			return r, (off - r.Offset) / r.PageSize, true
		}
	}
	return nil, 0, false
}
