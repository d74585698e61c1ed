package uffd

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// BenchmarkServe measures the server from the faulting side: a child VMM
// maps 64 MiB, registers it and reads every 4 KiB page once, timing each
// fault; reported are faults served per second and the p50/p99 fault
// latency, for a flat image (depth 1) and a chain of a base and two
// layers (depth 3), with 1, 2 and 4 faulting threads (vCPUs; one thread
// measures the latency of a round trip, several the server's throughput),
// the server sleeping in poll(2) between events (mode=poll) or busy-polling
// (mode=busypoll). mode=around16 answers each fault with up to 16 pages
// (Options.FaultAround) and reports pages/s besides faults/s: the child
// reads memory in order, the best case for it.
//
//	go test -run '^$' -bench Serve -benchtime 5x ./internal/uffd/
func BenchmarkServe(b *testing.B) {
	requiresUserfaultfd(b)
	const pages = 16384
	modes := []struct {
		name string
		opts Options
	}{
		{"poll", Options{}},
		{"busypoll", Options{BusyPoll: benchBusyPoll}},
		{"around16", Options{BusyPoll: benchBusyPoll, FaultAround: 16}},
	}
	for _, depth := range []int{1, 3} {
		fx := writeChain(b, pages, depth)
		c := fx.open(b)
		for _, threads := range []int{1, 2, 4} {
			for _, mode := range modes {
				b.Run(fmt.Sprintf("depth=%d/threads=%d/mode=%s", depth, threads, mode.name), func(b *testing.B) {
					benchServe(b, c, mode.opts, pages, threads)
				})
			}
		}
	}
}

// benchBusyPoll is the busy-poll window the benchmark measures.
const benchBusyPoll = 50 * time.Microsecond

func benchServe(b *testing.B, c *Chain, opts Options, pages, threads int) {
	var served, faults uint64
	var elapsed, p50, p99 time.Duration
	for b.Loop() {
		s := startServer(b, c, opts)
		out := runVMM(b, s, "bench", envSplit+"="+strconv.Itoa(pages), envThreads+"="+strconv.Itoa(threads))
		if err := s.stop(b); err != nil {
			b.Fatal(err)
		}
		var r benchResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			b.Fatalf("child output %q: %v", out, err)
		}
		st := s.srv.Stats()
		if opts.FaultAround == 0 && st.Faults != uint64(pages) {
			b.Fatalf("served %d faults, want %d", st.Faults, pages)
		}
		if got := st.Copied + st.Zeroed; got != uint64(pages) {
			b.Fatalf("installed %d pages, want %d", got, pages)
		}
		served += uint64(r.Pages)
		faults += st.Faults
		elapsed += time.Duration(r.ElapsedNS)
		p50 = max(p50, time.Duration(r.P50NS))
		p99 = max(p99, time.Duration(r.P99NS))
	}
	b.ReportMetric(float64(faults)/elapsed.Seconds(), "faults/s")
	if opts.FaultAround > 1 {
		b.ReportMetric(float64(served)/elapsed.Seconds(), "pages/s")
	}
	b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(p99.Nanoseconds())/1e3, "p99-µs")
}
