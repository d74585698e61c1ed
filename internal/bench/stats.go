package bench

import (
	"sort"
	"sync"
	"time"
)

// percentile is the p-quantile (0 to 1) of xs, the nearest rank; 0 for
// no numbers.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(p*float64(len(s)-1) + 0.5)
	return s[i]
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		if x > m {
			m = x
		}
	}
	return m
}

func meanOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// millis is a duration in milliseconds, as the reports give them.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// latencies collects request durations (ms) from many goroutines.
type latencies struct {
	mu sync.Mutex
	ms []float64
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ms = append(l.ms, millis(d))
	l.mu.Unlock()
}
