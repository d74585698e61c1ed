package uffd

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestParseMappings(t *testing.T) {
	const mem = 16 << 20
	ok := `{"base_host_virt_addr":1048576,"size":4194304,"offset":0,"page_size":4096}`
	for _, tc := range []struct {
		name, json, want string
	}{
		{"one region", `[` + ok + `]`, ""},
		{"legacy page_size_kib", `[{"base_host_virt_addr":1048576,"size":4096,"offset":0,"page_size_kib":4096}]`, ""},
		{"two regions", `[` + ok + `,{"base_host_virt_addr":8388608,"size":2097152,"offset":4194304,"page_size":4096}]`, ""},
		{"huge pages", `[{"base_host_virt_addr":2097152,"size":4194304,"offset":2097152,"page_size":2097152}]`, ""},
		{"not JSON", `{`, "does not decode"},
		{"not an array", `{"size":1}`, "does not decode"},
		{"empty", `[]`, "0 regions"},
		{"too many", `[` + strings.Repeat(ok+",", MaxRegions) + ok + `]`, "65 regions"},
		{"odd page size", `[{"base_host_virt_addr":1048576,"size":8192,"offset":0,"page_size":8192}]`, "page_size 8192"},
		{"no page size", `[{"base_host_virt_addr":1048576,"size":8192,"offset":0}]`, "page_size 0"},
		{"sizes disagree", `[{"base_host_virt_addr":1048576,"size":8192,"offset":0,"page_size":4096,"page_size_kib":4}]`, "disagree"},
		{"size not whole pages", `[{"base_host_virt_addr":1048576,"size":5000,"offset":0,"page_size":4096}]`, "size 5000"},
		{"zero size", `[{"base_host_virt_addr":1048576,"size":0,"offset":0,"page_size":4096}]`, "size 0"},
		{"unaligned address", `[{"base_host_virt_addr":1048577,"size":4096,"offset":0,"page_size":4096}]`, "base_host_virt_addr"},
		{"null address", `[{"base_host_virt_addr":0,"size":4096,"offset":0,"page_size":4096}]`, "base_host_virt_addr"},
		{"address overflow", `[{"base_host_virt_addr":18446744073709547520,"size":8192,"offset":0,"page_size":4096}]`, "overflows"},
		{"unaligned offset", `[{"base_host_virt_addr":1048576,"size":4096,"offset":100,"page_size":4096}]`, "offset 100"},
		{"beyond the memory", `[{"base_host_virt_addr":1048576,"size":4096,"offset":16777216,"page_size":4096}]`, "beyond"},
		{"negative size", `[{"base_host_virt_addr":1048576,"size":-4096,"offset":0,"page_size":4096}]`, "does not decode"},
		{"host overlap", `[` + ok + `,{"base_host_virt_addr":4194304,"size":4096,"offset":8388608,"page_size":4096}]`, "overlap in host addresses"},
		{"offset overlap", `[` + ok + `,{"base_host_virt_addr":16777216,"size":4096,"offset":4096,"page_size":4096}]`, "overlap in memory offsets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := ParseMappings([]byte(tc.json), mem)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range ms {
					if m.PageSize == 0 {
						t.Fatalf("page size not settled: %+v", m)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want an invalid-argument error containing %q", err, tc.want)
			}
		})
	}
}
