package bench

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3} // unsorted: percentile sorts a copy
	for _, c := range []struct{ p, want float64 }{{0, 1}, {0.5, 3}, {0.9, 5}, {1, 5}, {0.25, 2}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("p%v of %v: %v, want %v", c.p*100, xs, got, c.want)
		}
	}
	if xs[0] != 5 {
		t.Errorf("percentile sorted its input: %v", xs)
	}
	if percentile(nil, 0.5) != 0 || maxOf(nil) != 0 || meanOf(nil) != 0 {
		t.Error("no numbers: want 0")
	}
	if maxOf(xs) != 5 || meanOf(xs) != 3 {
		t.Errorf("max %v mean %v of %v", maxOf(xs), meanOf(xs), xs)
	}
	if got := millis(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("millis(1.5ms) = %v", got)
	}
}
