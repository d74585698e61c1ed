package tailbuf

import (
	"strings"
	"testing"
)

func TestKeepsTheLastBytes(t *testing.T) {
	b := New(8)
	b.Write([]byte("hello "))
	b.Write([]byte("world"))
	if got := b.String(); got != "lo world" {
		t.Errorf("after two writes: %q", got)
	}
	b.Write([]byte(strings.Repeat("x", 100) + "12345678"))
	if got := b.String(); got != "12345678" {
		t.Errorf("after a write past Max: %q", got)
	}
}
