// Package uffd is a userfaultfd page server: it serves the guest memory of
// a VMM restored from a snapshot, page by page as the guest touches it,
// the way Firecracker's `Uffd` memory backend expects (snapshot/load with
// mem_backend.backend_type = "Uffd").
//
// The protocol (Firecracker's docs/snapshotting/handling-page-faults-on-
// snapshot-resume.md): the server listens on a Unix socket; the VMM maps
// guest memory anonymously, registers it with a userfaultfd of its own,
// connects, and sends in one message the userfaultfd (SCM_RIGHTS) and a
// JSON array of regions (Mapping: base_host_virt_addr, size, offset,
// page_size). Nothing else is said on the socket. The server then reads
// the userfaultfd's events and answers each missing-page fault with
// UFFDIO_COPY (the page's bytes) or UFFDIO_ZEROPAGE (a page of zeros), and
// follows UFFD_EVENT_REMOVE (a balloon's madvise(MADV_DONTNEED)): a removed
// page faults back in as zeros, not from the snapshot.
//
// The snapshot's memory is a Chain: a base memory file and diff layers
// (package memlayer: a sparse image plus the index of the pages it
// holds), newest first. A fault reads the page from the newest layer that
// has it, so a chain is served without assembling a flat image.
//
// A WorkingSet is the list of pages a previous run faulted, in order;
// given one, the server copies those pages in while it serves faults
// (prefetch), so a restored guest finds most of what it touches already
// present.
//
// Serving is tuned by Options: BusyPoll keeps the event loop reading for a
// while after an event instead of sleeping (one thread wake-up less per
// fault, a CPU kept busy), and FaultAround answers a fault with the run of
// pages after it too (one pread and one UFFDIO_COPY for up to
// MaxFaultAround pages). Both are off by default.
//
// Memory stays bounded: one bit per page of each region (removed pages),
// one bit per page when recording a working set plus its list of page
// offsets (at most one per page), and one page-sized buffer per goroutine
// (the event loop's holds FaultAround pages). Serving a fault allocates
// nothing.
//
// The engine starts one for each child restored with the uffd memory
// backend (internal/sandbox/pageserver.go, forkd serve --memory-backend
// uffd); package uffdtest stands in for the VMM side in tests.
package uffd
