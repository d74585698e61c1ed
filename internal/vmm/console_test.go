package vmm

import "testing"

func TestEscapeConsole(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\nand\ttabs\n", "plain text\nand\ttabs\n"},
		{"serial\r\nline ends\r\n", "serial\nline ends\n"},
		{"héllo wörld ✓", "héllo wörld ✓"},
		// CSI: clear screen, cursor home; OSC: window title.
		{"\x1b[2J\x1b[Hfake prompt$ ", `\x1b[2J\x1b[Hfake prompt$ `},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		// A lone CR would let the rest overwrite the line.
		{"ok\rFAIL", `ok\x0dFAIL`},
		{"nul\x00 bs\x08 del\x7f", `nul\x00 bs\x08 del\x7f`},
		// C1 CSI as UTF-8, and as a raw (invalid UTF-8) byte.
		{"c1 \u009b2J", `c1 \u009b2J`},
		{"raw \x9b2J", "raw \uFFFD2J"},
		{"", ""},
	} {
		if got := EscapeConsole(c.in); got != c.want {
			t.Errorf("EscapeConsole(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Whatever the input, no control character but newline and tab is left.
func TestEscapeConsoleLeavesNoControls(t *testing.T) {
	var all []byte
	for b := 0; b < 256; b++ {
		all = append(all, byte(b), 'x')
	}
	all = append(all, []byte("\u0085\u009f\r")...)
	for _, r := range EscapeConsole(string(all)) {
		if (r < 0x20 && r != '\n' && r != '\t') || (r >= 0x7f && r <= 0x9f) {
			t.Fatalf("control %U left in the output", r)
		}
	}
}
