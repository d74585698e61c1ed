package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// TestPooledChildIndistinguishable forks two children of one snapshot at
// once with a pool of one: one was restored ahead and rehearsed its first
// request in the pool (py-min's rehearse code assigns, prints, writes a
// file and draws a random number), the other is restored on the fork's
// path. Nothing of the rehearsal shows, and the two answer alike: their
// identity, clock, generators, Python globals, cell numbering and files.
func TestPooledChildIndistinguishable(t *testing.T) {
	e := newEngine(t, 1)
	snap := newTemplate(t, e, "py-min")
	if err := e.Warm(snap.Tag); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the pool to hold a rehearsed child", func() bool { return e.PoolSize(snap.ID) == 1 })
	ctx := context.Background()
	sbs, err := e.Fork(ctx, snap.Tag, 2)
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[bool]string{}
	for _, s := range sbs {
		byKind[s.Rehearsed] = s.ID
	}
	pooled, fresh := byKind[true], byKind[false]
	if pooled == "" || fresh == "" {
		t.Fatalf("want one rehearsed child and one restored on the fork's path: %+v, %+v", sbs[0].Info(), sbs[1].Info())
	}
	run := func(id, code string) agentapi.RunCodeResult {
		t.Helper()
		res, err := agentOf(t, e, id).RunCode(ctx, agentapi.RunCodeRequest{Code: code})
		if err != nil {
			t.Fatalf("%s: run %q: %v", id, code, err)
		}
		return res
	}
	// The same requests in both, in the same order: every answer but the
	// identity and the random draws must match.
	same := []string{
		"warmed",
		"sorted(k for k in globals() if not k.startswith('__'))",
		"import os; sorted(os.listdir('/tmp')), sorted(os.listdir('.'))",
		"1/0",
		fmt.Sprintf("import time; abs(time.time() - %d) < 120", time.Now().Unix()),
	}
	for i, code := range same {
		a, b := run(pooled, code), run(fresh, code)
		if i == 0 && (a.Stdout != "" || a.Stderr != "") {
			t.Fatalf("the rehearsal's output reached the child's first request: %+v", a)
		}
		if a.Result["text/plain"] != b.Result["text/plain"] || a.Stdout != b.Stdout || !sameError(a.Error, b.Error) {
			t.Fatalf("%q answers differ:\n rehearsed: %+v\n restored now: %+v", code, a, b)
		}
		if i == 0 && a.Result["text/plain"] != "'yes'" {
			t.Fatalf("the rehearsal's assignment reached the session: warmed = %s", a.Result["text/plain"])
		}
		if i == len(same)-1 && a.Result["text/plain"] != "True" {
			t.Fatalf("clock not set at hand-out: %+v", a)
		}
	}
	if r := run(pooled, "'leaked' in globals()"); r.Result["text/plain"] != "False" {
		t.Fatalf("the rehearsal's globals leaked: %+v", r)
	}
	// Identity: each its own hostname and generators.
	host := "import socket; socket.gethostname()"
	for _, id := range []string{pooled, fresh} {
		if r := run(id, host); r.Result["text/plain"] != "'"+id+"'" {
			t.Fatalf("%s: hostname %s", id, r.Result["text/plain"])
		}
	}
	for _, code := range []string{"random.random()", "import os; os.urandom(8).hex()"} {
		if a, b := run(pooled, code), run(fresh, code); a.Result["text/plain"] == b.Result["text/plain"] {
			t.Fatalf("%q: the same in both children: %s", code, a.Result["text/plain"])
		}
	}
}

func sameError(a, b *agentapi.CodeError) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Name == b.Name && a.Value == b.Value && a.Traceback == b.Traceback
}

// TestPooledChildWithoutPythonRehearsesExec: a pooled child of a snapshot
// without a Python session rehearses an exec of `true`, and answers as
// its own sandbox.
func TestPooledChildWithoutPythonRehearsesExec(t *testing.T) {
	e := newEngine(t, 1)
	snap := newTemplate(t, e, "minimal")
	if err := e.Warm(snap.Tag); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the pool to hold a rehearsed child", func() bool { return e.PoolSize(snap.ID) == 1 })
	sbs, err := e.Fork(context.Background(), snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := sbs[0]
	if !s.Pooled || !s.Rehearsed {
		t.Fatalf("pooled %v rehearsed %v, want both", s.Pooled, s.Rehearsed)
	}
	if got := run(t, agentOf(t, e, s.ID), "hostname"); got != s.ID {
		t.Fatalf("hostname %q, want %s", got, s.ID)
	}
}
