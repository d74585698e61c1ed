package bench

import (
	"os"
	"strings"
	"testing"
)

func TestParseSmapsRollup(t *testing.T) {
	// The shape of /proc/PID/smaps_rollup (values in kB).
	text := `55a0c3e00000-7ffd2a7fe000 ---p 00000000 00:00 0                          [rollup]
Rss:              262144 kB
Pss:              131072 kB
Pss_Anon:          65536 kB
Shared_Clean:     131072 kB
Private_Clean:      1024 kB
Private_Dirty:     32768 kB
Private_Hugetlb:    4096 kB
Swap:                  0 kB
`
	pss, private, err := parseSmapsRollup(strings.NewReader(text))
	if err != nil || pss != 131072+4096 || private != 1024+32768+4096 {
		t.Fatalf("pss %d private %d (%v); want %d and %d", pss, private, err, 131072+4096, 1024+32768+4096)
	}
}

// smapsRollup reads a live process's: this one has memory of its own.
func TestSmapsRollupOfThisProcess(t *testing.T) {
	pss, private, err := smapsRollup(os.Getpid())
	if err != nil {
		t.Skipf("no smaps_rollup here: %v", err)
	}
	if pss <= 0 || private <= 0 {
		t.Fatalf("pss %d kB, private %d kB: want both above 0", pss, private)
	}
	if _, _, err := smapsRollup(deadPID(t)); err == nil {
		t.Fatal("a dead process has no smaps_rollup")
	}
}
