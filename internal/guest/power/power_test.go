package power

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/t\011x`: "/t\tx"} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseStat(t *testing.T) {
	st, fl, ok := parseStat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0")
	if !ok || st != 'S' || fl&pfKthread == 0 {
		t.Fatalf("kthreadd: %c %x %v", st, fl, ok)
	}
	st, fl, ok = parseStat("77 (sh (weird) name) Z 1 77 77 0 -1 4194560 0 0")
	if !ok || st != 'Z' || fl&pfKthread != 0 {
		t.Fatalf("zombie: %c %x %v", st, fl, ok)
	}
	if _, _, ok := parseStat("garbage"); ok {
		t.Fatal("garbage parsed")
	}
}
