package progress

import (
	"fmt"
	"strings"
	"time"
	"unicode"
)

// HumanBytes writes n bytes in binary units: "512 B", "1.5 GiB".
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// humanRate writes a rate in bytes per second ("" when not measured).
func humanRate(bps float64) string {
	if bps <= 0 {
		return ""
	}
	return HumanBytes(int64(bps)) + "/s"
}

// humanDuration rounds d for people: tenths of a second under a minute,
// whole seconds above.
func humanDuration(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

// percent is how much of total done is, in whole percent (floor).
func percent(done, total int64) int64 {
	if total <= 0 {
		return 100
	}
	return min(done*100/total, 100)
}

// bytesText is a step's byte count for people:
// "120.0 MiB of 512.0 MiB (23%), 24.0 MiB/s, 16s left" while it moves,
// "512.0 MiB in 7.3s, 70.1 MiB/s" once final; without a total, no share
// and no time left.
func bytesText(s State) string {
	var b strings.Builder
	b.WriteString(HumanBytes(s.Bytes))
	if s.Total >= 0 && !(s.Final && s.Bytes == s.Total) {
		fmt.Fprintf(&b, " of %s (%d%%)", HumanBytes(s.Total), percent(s.Bytes, s.Total))
	}
	if s.Final {
		fmt.Fprintf(&b, " in %s", humanDuration(s.StepElapsed))
	}
	if r := humanRate(s.Rate); r != "" {
		b.WriteString(", " + r)
	}
	if eta, ok := s.ETA(); ok {
		b.WriteString(", " + humanDuration(eta) + " left")
	}
	return b.String()
}

// printable is a step's name for a terminal: control characters (a
// newline would break a bar's line; an escape could move the cursor)
// become spaces.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}
