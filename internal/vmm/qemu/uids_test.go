package qemu

import (
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestUIDPool(t *testing.T) {
	r := UIDRange{First: 2_000_000_000, Count: 64}
	p := newUIDPool(r)
	// Concurrent takers never share a uid, and all of the range is used.
	var mu sync.Mutex
	got := map[int]bool{}
	var wg sync.WaitGroup
	for i := 0; i < r.Count; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid, err := p.take()
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if got[uid] || !r.Contains(uid) {
				t.Errorf("uid %d handed out twice or outside %+v", uid, r)
			}
			got[uid] = true
		}()
	}
	wg.Wait()
	if _, err := p.take(); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("take from a full range: %v, want resource exhausted", err)
	}
	// A released uid is the only one free, so it comes back.
	p.release(r.First + 7)
	if uid, err := p.take(); err != nil || uid != r.First+7 {
		t.Fatalf("take after release: %d, %v", uid, err)
	}
	// An adopted VMM's uid counts as taken; one outside the range is ignored.
	p2 := newUIDPool(UIDRange{First: 2_000_000_000, Count: 1})
	p2.mark(65534)
	p2.mark(2_000_000_000)
	if _, err := p2.take(); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("take with the only uid adopted: %v", err)
	}
}

func TestUIDRangeValidate(t *testing.T) {
	for _, r := range []UIDRange{{First: 0, Count: 10}, {First: 10, Count: 0}, {First: 1<<31 - 5, Count: 10}} {
		if err := r.validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if err := DefaultUIDRange.validate(); err != nil {
		t.Error(err)
	}
	if _, err := New(Config{RunAs: "nobody", UIDs: DefaultUIDRange}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("RunAs and UIDs together: %v", err)
	}
}
