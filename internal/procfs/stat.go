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
)

// Stat is what forkd reads from /proc/PID/stat.
type Stat struct {
	State     byte   // field 3: R, S, D, Z (zombie), X (dead), ...
	Flags     uint64 // field 9: PF_* flags
	StartTime uint64 // field 22: clock ticks after boot
	ExitCode  int    // field 52: wait status of an exited process, -1 if absent
}

// PFKthread is PF_KTHREAD in Stat.Flags.
const PFKthread = 0x00200000

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
