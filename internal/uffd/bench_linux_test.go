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
// layers (depth 3), with one and two faulting threads (vCPUs).
//
//	go test -run '^$' -bench Serve -benchtime 5x ./internal/uffd/
func BenchmarkServe(b *testing.B) {
	requiresUserfaultfd(b)
	const pages = 16384
	for _, depth := range []int{1, 3} {
		fx := writeChain(b, pages, depth)
		c := fx.open(b)
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("depth=%d/threads=%d", depth, threads), func(b *testing.B) {
				var faults, elapsed time.Duration
				var p50, p99 time.Duration
				for b.Loop() {
					s := startServer(b, c, Options{})
					out := runVMM(b, s, "bench", envSplit+"="+strconv.Itoa(pages), envThreads+"="+strconv.Itoa(threads))
					if err := s.stop(b); err != nil {
						b.Fatal(err)
					}
					var r benchResult
					if err := json.Unmarshal([]byte(out), &r); err != nil {
						b.Fatalf("child output %q: %v", out, err)
					}
					if st := s.srv.Stats(); st.Faults != pages {
						b.Fatalf("served %d faults, want %d", st.Faults, pages)
					}
					faults += time.Duration(r.Pages)
					elapsed += time.Duration(r.ElapsedNS)
					p50 = max(p50, time.Duration(r.P50NS))
					p99 = max(p99, time.Duration(r.P99NS))
				}
				b.ReportMetric(float64(faults)/elapsed.Seconds(), "faults/s")
				b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(p99.Nanoseconds())/1e3, "p99-µs")
			})
		}
	}
}
