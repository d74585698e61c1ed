package metrics

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// gauges returns the values of a gauge family by its dir label.
func gauges(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if mf.GetType().String() != "GAUGE" {
			t.Fatalf("%s is a %v, want a gauge", name, mf.GetType())
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "dir" {
					out[lp.GetValue()] = mt.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

func TestFilesystemsAreReadAtScrapeTime(t *testing.T) {
	m := New("dev")
	if got := gauges(t, m, "forkd_filesystem_size_bytes"); len(got) != 0 {
		t.Fatalf("file systems reported before any was set: %v", got)
	}
	dir := t.TempDir()
	m.SetFilesystems(Filesystem{Dir: "data", Path: dir}, Filesystem{Dir: "run", Path: filepath.Join(dir, "missing")})
	size := gauges(t, m, "forkd_filesystem_size_bytes")
	avail := gauges(t, m, "forkd_filesystem_available_bytes")
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	// The size of a file system does not change under the test; what is
	// available does (other processes write), so it is checked for sense.
	if want := float64(st.Blocks) * float64(st.Frsize); size["data"] != want || want == 0 {
		t.Errorf("data size = %g, statfs says %g", size["data"], want)
	}
	if a := avail["data"]; a <= 0 || a > size["data"] {
		t.Errorf("data available = %g of %g", a, size["data"])
	}
	if _, ok := size["run"]; ok {
		t.Errorf("a directory that does not exist was reported: %v", size)
	}
	if len(size) != 1 || len(avail) != 1 {
		t.Errorf("series: size %v, available %v; want data only", size, avail)
	}
}
