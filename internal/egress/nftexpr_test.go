package egress

import (
	"net/netip"
	"slices"
	"testing"
)

// TestIntervals: prefixes become merged [start, end) elements; a run that
// reaches the top of the address space has no end element.
func TestIntervals(t *testing.T) {
	p := netip.MustParsePrefix
	got := intervals([]netip.Prefix{p("10.231.0.0/16"), p("240.0.0.0/4"), p("10.0.0.0/8"), p("224.0.0.0/4"), p("11.0.0.0/8"), p("0.0.0.0/8")})
	type el struct {
		key string
		end bool
	}
	var have []el
	for _, e := range got {
		a, _ := netip.AddrFromSlice(e.Key)
		have = append(have, el{a.String(), e.IntervalEnd})
	}
	want := []el{{"0.0.0.0", false}, {"1.0.0.0", true}, {"10.0.0.0", false}, {"12.0.0.0", true}, {"224.0.0.0", false}}
	if !slices.Equal(have, want) {
		t.Errorf("intervals = %v, want %v", have, want)
	}
	if got := intervals([]netip.Prefix{p("198.51.100.7/32")}); len(got) != 2 || !got[1].IntervalEnd {
		t.Errorf("a single address: %v", got)
	}
}
