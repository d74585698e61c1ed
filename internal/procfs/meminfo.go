package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Meminfo is what forkd reads from /proc/meminfo, in bytes.
type Meminfo struct {
	Total     int64 // MemTotal
	Available int64 // MemAvailable: what can be allocated without swapping
}

// ReadMeminfo reads /proc/meminfo (a few KiB; read through 64 KiB at most).
func ReadMeminfo() (Meminfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Meminfo{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return Meminfo{}, fmt.Errorf("read /proc/meminfo: %w", err)
	}
	return ParseMeminfo(b)
}

// ParseMeminfo reads MemTotal and MemAvailable from /proc/meminfo's
// "Name:   N kB" lines; MemTotal is required.
func ParseMeminfo(b []byte) (Meminfo, error) {
	var m Meminfo
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var dst *int64
		switch string(f[0]) {
		case "MemTotal:":
			dst = &m.Total
		case "MemAvailable:":
			dst = &m.Available
		default:
			continue
		}
		kib, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil || kib < 0 || kib > 1<<53 {
			return Meminfo{}, fmt.Errorf("/proc/meminfo: %s %q is not a size in KiB", f[0], f[1])
		}
		*dst = kib << 10
	}
	if m.Total == 0 {
		return Meminfo{}, fmt.Errorf("/proc/meminfo: no MemTotal line")
	}
	return m, nil
}
