package vmm

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// EscapeConsole makes text from a guest's console (or a VMM's output)
// safe to show on an operator's terminal: a guest runs untrusted code as
// root and can print anything to its serial port, including escape
// sequences that move the cursor, rewrite earlier lines, retitle the
// window or, on some terminals, answer back as typed input. Every control
// character but newline and tab becomes visible text: C0 and DEL as \xNN,
// C1 (U+0080-U+009F) as \uNNNN. A CRLF, the serial console's line end,
// is a newline; a lone CR (which would let later text overwrite the line)
// is escaped. Invalid UTF-8 (a raw 0x9b is CSI to an 8-bit terminal)
// becomes U+FFFD.
func EscapeConsole(s string) string {
	if !needsEscape(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	b.Grow(len(s))
	for i, r := range s {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r == '\r' && strings.HasPrefix(s[i+1:], "\n"):
			// CRLF: the LF that follows is the line end.
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r <= 0x9f:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// needsEscape reports whether s has anything EscapeConsole changes.
func needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f || c >= 0x80 {
			// Bytes >= 0x80 are mostly printable UTF-8: check properly.
			if c < 0x80 {
				return true
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError || (r >= 0x80 && r <= 0x9f) {
				return true
			}
			i += size - 1
		}
	}
	return false
}
