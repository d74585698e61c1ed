// Package procfs reads what forkd acts on in /proc/PID: from stat, whether
// a process has exited, whether it is a kernel thread, and its start time
// (which, with the pid, names one process across pid reuse); and its
// command line, read again while a process still in execve shows none.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stat is what forkd reads from /proc/PID/stat.
type Stat struct {
	State     byte   // field 3: R, S, D, Z (zombie), X (dead), ...
	Flags     uint64 // field 9: PF_* flags
	UTime     uint64 // field 14: user CPU, clock ticks, all threads
	STime     uint64 // field 15: system CPU, clock ticks, all threads
	StartTime uint64 // field 22: clock ticks after boot
	ExitCode  int    // field 52: wait status of an exited process, -1 if absent
}

// PFKthread is PF_KTHREAD in Stat.Flags.
const PFKthread = 0x00200000

// clockTick is the unit of the CPU and start times in stat (USER_HZ, 100
// on every Linux ABI).
const clockTick = 10 * time.Millisecond

// CPU is the CPU time the process has used, user and system, in all of
// its threads (those that ended included), at a 10 ms resolution.
func (s Stat) CPU() time.Duration { return time.Duration(s.UTime+s.STime) * clockTick }

// Exited: the process has exited (a zombie not yet reaped, or dead).
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(pid, b)
}

// ParseStat parses a /proc/PID/stat line. The command name (field 2) is in
// parentheses and may itself hold spaces and parentheses, so the fields are
// counted from the last ')'.
func ParseStat(pid int, b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: malformed %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: malformed %q", pid, b)
	}
	st := Stat{State: f[0][0], ExitCode: -1}
	var err error
	if st.Flags, err = strconv.ParseUint(f[6], 10, 64); err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: flags: %w", pid, err)
	}
	if st.UTime, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: utime: %w", pid, err)
	}
	if st.STime, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: stime: %w", pid, err)
	}
	if st.StartTime, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	if len(f) >= 50 {
		if c, err := strconv.Atoi(f[49]); err == nil {
			st.ExitCode = c
		}
	}
	return st, nil
}
