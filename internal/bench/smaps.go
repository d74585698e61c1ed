package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// smapsRollup reads Pss and private memory (kB) of a process. Pages a
// clone copied on hugetlbfs (Private_Hugetlb) are in neither kernel field
// and are added to both; the huge pages it shares with other clones (the
// image) are left out, as a share of them is not reported.
func smapsRollup(pid int) (pss, private int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return parseSmapsRollup(f)
}

// parseSmapsRollup reads smaps_rollup's text (see smapsRollup).
func parseSmapsRollup(r io.Reader) (pss, private int64, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Pss:":
			pss = v
		case "Private_Clean:", "Private_Dirty:":
			private += v
		case "Private_Hugetlb:":
			pss += v
			private += v
		}
	}
	return pss, private, sc.Err()
}
