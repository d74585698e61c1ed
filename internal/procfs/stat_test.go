package procfs

import (
	"os"
	"testing"
	"time"
)

func TestReadStatOwnProcess(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.StartTime == 0 || st.State == 0 || st.Exited() || st.Flags&PFKthread != 0 {
		t.Errorf("own stat %+v", st)
	}
	if _, err := ReadStat(-1); err == nil {
		t.Error("pid -1 read")
	}
}

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		line    string
		want    Stat
		kthread bool
	}{
		// The command name may hold spaces and parentheses.
		{"42 (a) b (c) Z 1 42 42 0 -1 4194560 0 0 0 0 250 37 0 0 20 0 1 0 123456 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 9\n",
			Stat{State: 'Z', Flags: 4194560, UTime: 250, STime: 37, StartTime: 123456, ExitCode: 9}, false},
		// An older kernel's line stops before the exit code.
		{"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 7 0 0",
			Stat{State: 'S', Flags: 2129984, StartTime: 7, ExitCode: -1}, true},
	} {
		st, err := ParseStat(1, []byte(c.line))
		if err != nil || st != c.want || (st.Flags&PFKthread != 0) != c.kthread {
			t.Errorf("parse %q = %+v, %v; want %+v", c.line, st, err, c.want)
		}
	}
	for _, bad := range []string{"garbage", "1 (x) S 0 0", "1 (x) S 0 0 0 0 -1 flags 0 0 0 0 0 0 0 0 20 0 1 0 7 0 0"} {
		if st, err := ParseStat(1, []byte(bad)); err == nil {
			t.Errorf("%q parsed as %+v", bad, st)
		}
	}
	if got := (Stat{UTime: 250, STime: 37}).CPU(); got != 2870*time.Millisecond {
		t.Errorf("CPU of 250+37 ticks = %v", got)
	}
}
