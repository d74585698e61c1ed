package procfs

import "testing"

func TestParseMeminfo(t *testing.T) {
	m, err := ParseMeminfo([]byte("MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   12288000 kB\nHugePages_Total:       0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Total != 24576000<<10 || m.Available != 12288000<<10 {
		t.Fatalf("got %+v", m)
	}
	for _, bad := range []string{"", "MemFree: 1 kB\n", "MemTotal: x kB\n", "MemTotal: -5 kB\n"} {
		if _, err := ParseMeminfo([]byte(bad)); err == nil {
			t.Errorf("ParseMeminfo(%q) gave no error", bad)
		}
	}
	live, err := ReadMeminfo()
	if err != nil {
		t.Fatal(err)
	}
	if live.Total <= 0 || live.Available <= 0 || live.Available > live.Total {
		t.Fatalf("this host's /proc/meminfo read as %+v", live)
	}
}
