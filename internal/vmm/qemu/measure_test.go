package qemu

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil/testguest"
)

// TestForkMeasurements times clones of the test template under a few
// driver settings. It takes about a minute, so it runs only with
// FORKD_TEST_MEASURE=1:
//
//	FORKD_TEST_MEASURE=1 go test -run TestForkMeasurements -v ./internal/vmm/qemu/
//
// Per setting, n clones one after another: Prepare (QEMU start to QMP ready
// plus capabilities and the state file handover), Restore (migrate-incoming
// to running), the first agent answer, a busybox workload, and the clone's
// QEMU RSS/PSS after it.
func TestForkMeasurements(t *testing.T) {
	if os.Getenv("FORKD_TEST_MEASURE") != "1" {
		t.Skip("set FORKD_TEST_MEASURE=1 to measure")
	}
	f := template(t)
	const n = 5
	workload := "run for i in 1 2 3 4 5 6 7 8; do ls -lR /sys/class >/dev/null; " +
		"awk 'BEGIN{s=0; for(i=0;i<20000;i++) s+=i*i; print s}' >/dev/null; " +
		"sha256sum /bin/busybox >/dev/null; sed -n 3p /init >/dev/null; ps >/dev/null; done; echo done"
	for vi, v := range []struct {
		name string
		cfg  Config
	}{
		{"runas=nobody tb=64", Config{RunAs: "nobody", TBSizeMiB: 64}},
		{"runas=root tb=64", Config{TBSizeMiB: 64}},
		{"runas=nobody tb=16", Config{RunAs: "nobody", TBSizeMiB: 16}},
		{"runas=nobody tb=256", Config{RunAs: "nobody", TBSizeMiB: 256}},
		{"runas=nobody tb=qemu-default", Config{RunAs: "nobody", TBSizeMiB: -1}},
	} {
		d := newTestDriver(t, v.cfg)
		var qmpReady, prepare, restore, first, work, rss, pss []time.Duration
		for i := range n {
			start := time.Now()
			m, _ := f.clone(t, d, fmt.Sprintf("m%d%d", vi, i))
			prepare = append(prepare, time.Since(start))
			qmpReady = append(qmpReady, m.StartupTime())
			ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
			conn, err := m.DialAgent(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a := testguest.NewAgent(conn)
			tm, err := m.Restore(ctx)
			if err != nil {
				t.Fatal(err)
			}
			restore = append(restore, tm.Load)
			start = time.Now()
			if r, err := a.Call("ping", callTimeout); err != nil || r != "pong" {
				t.Fatalf("ping %q %v", r, err)
			}
			first = append(first, time.Since(start))
			start = time.Now()
			if r, err := a.Call(workload, callTimeout); err != nil || !strings.Contains(r, "done") {
				t.Fatalf("workload %q %v", r, err)
			}
			work = append(work, time.Since(start))
			r, p := smaps(t, m.PID())
			rss, pss = append(rss, time.Duration(r)), append(pss, time.Duration(p))
			a.Close()
			m.Kill()
			<-m.Done()
			cancel()
		}
		t.Logf("%-30s QMP ready %v, Prepare %v, Restore %v, first answer %v, workload %v, RSS %d MiB, PSS %d MiB (medians of %d)",
			v.name, med(qmpReady), med(prepare), med(restore), med(first), med(work), med(rss)>>10, med(pss)>>10, n)
	}
}

// smaps returns a process's RSS and PSS in KiB.
func smaps(t *testing.T, pid int) (rss, pss int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss
}

func med(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
