package agentconn

import (
	"encoding/binary"
	"testing"
)

func TestScanLine(t *testing.T) {
	tests := []struct {
		buf      string
		line     string
		consumed int
		ok       bool
	}{
		{"FORKD-HELLO {}\n", "{}", 15, true},
		{"junk\x00FORKD-HELLO {\"a\":1}\r\nrest", "{\"a\":1}", 26, true},
		{"junk FORKD-HEL", "", 5, false},     // partial prefix is kept
		{"junk FORKD-HELLO {", "", 5, false}, // line not finished: kept
		{"no prefix here", "", 14, false},    // all garbage
		{"FORKD-HELLO\n", "", 12, false},     // no space after the word: not a HELLO
	}
	for _, tt := range tests {
		line, consumed, ok := scanLine([]byte(tt.buf), "FORKD-HELLO ")
		if ok != tt.ok || string(line) != tt.line || consumed != tt.consumed {
			t.Errorf("scanLine(%q) = %q, %d, %v; want %q, %d, %v", tt.buf, line, consumed, ok, tt.line, tt.consumed, tt.ok)
		}
	}
}

func hdr(typ byte, flags uint16, id, length uint32) []byte {
	h := make([]byte, 12)
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:], flags)
	binary.BigEndian.PutUint32(h[4:], id)
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

func TestFrameTracker(t *testing.T) {
	ft := frameTracker{maxData: 100}
	var buf []byte
	buf = append(buf, hdr(yamuxTypeWindowUpdate, 1, 1, 1000)...)
	buf = append(buf, hdr(yamuxTypeData, 0, 1, 5)...)
	buf = append(buf, "hello"...)
	buf = append(buf, hdr(yamuxTypePing, 1, 0, 7)...)
	n, bad := ft.advance(buf)
	if n != len(buf) || bad {
		t.Fatalf("valid frames: n=%d bad=%v, want %d false", n, bad, len(buf))
	}
	// Payload split across reads.
	ft = frameTracker{maxData: 100}
	first := append(hdr(yamuxTypeData, 0, 3, 10), "abc"...)
	if n, bad := ft.advance(first); n != len(first) || bad || ft.payloadLeft != 7 {
		t.Fatalf("split payload: n=%d bad=%v left=%d", n, bad, ft.payloadLeft)
	}
	// The payload may contain anything, including a HELLO.
	if n, bad := ft.advance([]byte("FORKD-")); n != 6 || bad {
		t.Fatalf("payload bytes: n=%d bad=%v", n, bad)
	}
	// A partial header is kept until complete.
	ft = frameTracker{maxData: 100}
	if n, bad := ft.advance([]byte{0, 0, 0}); n != 0 || bad {
		t.Fatalf("partial header: n=%d bad=%v", n, bad)
	}
	// Garbage is recognised.
	for name, b := range map[string][]byte{
		"hello":        []byte("FORKD-HELLO {}\n"),
		"bad type":     {0, 9},
		"bad flags":    {0, 0, 0xff, 0},
		"data on 0":    hdr(yamuxTypeData, 0, 0, 1),
		"ping on 1":    hdr(yamuxTypePing, 0, 1, 1),
		"huge payload": hdr(yamuxTypeData, 0, 1, 101),
		"bad goaway":   hdr(yamuxTypeGoAway, 0, 0, 9),
	} {
		ft = frameTracker{maxData: 100}
		if n, bad := ft.advance(append(hdr(yamuxTypeWindowUpdate, 2, 1, 1), b...)); n != 12 || !bad {
			t.Errorf("%s: n=%d bad=%v, want 12 true", name, n, bad)
		}
	}
}
