package uffd

import (
	"os"

	"github.com/forkd-dev/forkd/internal/fsutil"
)

// MaxFaultAround bounds Options.FaultAround: the loop's buffer holds this
// many pages.
const MaxFaultAround = 64

// faultAround answers the fault on page idx of r with the run of pages
// from idx on (Options.FaultAround) that one file of the chain holds, in
// one pread and one UFFDIO_COPY, and reports
// whether it did. It leaves the fault to install (done false, nil) when
// fault-around is off, the region has huge pages, the page is removed or
// reads as zeros, or the copy did not put the faulting page in place
// (already present, the mappings changing, a run crossing into another
// mapping): the single-page path then answers it as ever.
//
// Only the event loop calls it, between reads of events: the removed
// marks it checks are those of every event read so far, as for a single
// page (see session.mu).
func (sess *session) faultAround(r *region, idx uint64, buf []byte) (done bool, err error) {
	n := uint64(sess.s.opts.FaultAround)
	ps := r.PageSize
	if n < 2 || ps != uint64(os.Getpagesize()) || r.removed.get(idx) {
		return false, nil
	}
	// One file's run of pages from the faulting one: one pread.
	off := r.Offset + idx*ps
	n = min(n, r.Size/ps-idx, uint64(len(buf))/ps, sess.s.chain.run(off, n*ps)/ps)
	for i := uint64(1); i < n; i++ {
		if r.removed.get(idx + i) {
			n = i
			break
		}
	}
	if n < 2 {
		return false, nil
	}
	run := buf[:n*ps]
	if _, err := sess.s.chain.ReadAt(run, off); err != nil {
		return false, err
	}
	// Stop at the first page of zeros: it is better mapped to the shared
	// zero page when (if) it faults.
	for i := uint64(0); i < n; i++ {
		if fsutil.IsZero(run[i*ps : (i+1)*ps]) {
			n = i
			break
		}
	}
	if n < 2 {
		return false, nil
	}
	// A copy that stops at a page already present installs the pages
	// before it (and wakes their waiters) and fails with EAGAIN: the
	// faulting page, the first, is in. One that installs nothing (the
	// faulting page present, the mappings changing, the run crossing a
	// mapping's end) leaves the fault to the single-page path.
	copied, _ := copyRange(sess.fd, r.BaseHostVirtAddr+idx*ps, run[:n*ps])
	if copied < int64(ps) {
		return false, nil
	}
	pages := uint64(copied) / ps
	sess.s.copied.Add(pages)
	sess.s.around.Add(pages - 1)
	return true, nil
}
