package qmp

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A reply close to the limit (five times QEMU's largest, query-qmp-schema)
// still goes through.
func TestLongReplyWithinLimit(t *testing.T) {
	c, _ := dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := strings.Repeat("x", MaxLineBytes-1024)
	var got string
	if err := c.Execute(ctx, "echo", big, &got); err != nil || got != big {
		t.Fatalf("echo of %d bytes: %d bytes back, %v", len(big), len(got), err)
	}
}

// A line without end (64 times the limit) fails the pending call with
// ErrClosed saying why, closes the client, and costs the client a small
// multiple of the limit in allocations, not the whole line.
func TestLineTooLong(t *testing.T) {
	c, f := dial(t)
	f.mu.Lock()
	f.flood = []byte(strings.Repeat("y", 1<<20))
	f.floodN = 64 * MaxLineBytes / len(f.flood)
	f.mu.Unlock()
	sub := c.Subscribe(nil)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.Execute(ctx, "flood", nil, nil)
	runtime.ReadMemStats(&after)

	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("Execute = %v, want ErrClosed naming the line that was too long", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*MaxLineBytes {
		t.Errorf("allocated %d MiB for a line cut off at %d MiB", alloc>>20, MaxLineBytes>>20)
	}
	requireClosed(t, c, sub, "longer than")
}
