package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Filesystem is a directory whose file system's space /metrics reports.
type Filesystem struct {
	// Dir is the dir label: what the directory is for ("data", "run",
	// "memory"), a fixed name, never the path.
	Dir string
	// Path is the directory.
	Path string
}

// SetFilesystems sets the directories whose file systems' size and
// available space are reported (forkd_filesystem_size_bytes,
// forkd_filesystem_available_bytes), read with statfs at every scrape. A
// directory that cannot be read (removed, unmounted) is left out of that
// scrape, so its series go stale rather than report a made-up value.
func (m *Metrics) SetFilesystems(fs ...Filesystem) {
	if m == nil {
		return
	}
	fs = append([]Filesystem(nil), fs...)
	m.filesystems.Store(&fs)
}

var (
	fsSizeDesc = prometheus.NewDesc("forkd_filesystem_size_bytes",
		"Size of the file system holding a daemon directory (dir: data, run, memory).", []string{"dir"}, nil)
	fsAvailDesc = prometheus.NewDesc("forkd_filesystem_available_bytes",
		"Space available to the daemon on the file system holding a daemon directory (statfs f_bavail, what df shows as Avail).", []string{"dir"}, nil)
)

// filesystemCollector statfs's the directories of SetFilesystems at scrape
// time.
type filesystemCollector struct{ m *Metrics }

func (c filesystemCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fsSizeDesc
	ch <- fsAvailDesc
}

func (c filesystemCollector) Collect(ch chan<- prometheus.Metric) {
	fs := c.m.filesystems.Load()
	if fs == nil {
		return
	}
	for _, f := range *fs {
		var st unix.Statfs_t
		if err := unix.Statfs(f.Path, &st); err != nil {
			continue
		}
		bsize := float64(st.Frsize) // the unit of f_blocks and f_bavail
		if bsize == 0 {
			bsize = float64(st.Bsize)
		}
		ch <- prometheus.MustNewConstMetric(fsSizeDesc, prometheus.GaugeValue, float64(st.Blocks)*bsize, f.Dir)
		ch <- prometheus.MustNewConstMetric(fsAvailDesc, prometheus.GaugeValue, float64(st.Bavail)*bsize, f.Dir)
	}
}
