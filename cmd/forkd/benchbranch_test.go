package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestBenchBranchFlags(t *testing.T) {
	if got, err := parseSizes("256, 1024"); err != nil || !slices.Equal(got, []int{256, 1024}) {
		t.Errorf("--memory 256, 1024: %v %v", got, err)
	}
	if got, err := parseDirties("0,64"); err != nil || !slices.Equal(got, []int{0, 64}) {
		t.Errorf("--dirty-mb 0,64: %v %v", got, err)
	}
	for _, bad := range []string{"", "32", "lots"} {
		if _, err := parseSizes(bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--memory") {
			t.Errorf("--memory %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"", "-1", "64MB"} {
		if _, err := parseDirties(bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--dirty-mb") {
			t.Errorf("--dirty-mb %q: %v", bad, err)
		}
	}
}
