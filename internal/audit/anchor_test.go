package audit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// memAnchors is an in-memory AnchorStore; state_test covers the bbolt one.
type memAnchors struct {
	mu      sync.Mutex
	a       Anchor
	puts    int
	putErr  error // PutAuditAnchor fails with it while set
	readErr error // AuditAnchor fails with it while set
}

func (m *memAnchors) AuditAnchor() (Anchor, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.a, m.readErr
}

func (m *memAnchors) PutAuditAnchor(a Anchor) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.putErr != nil {
		return m.putErr
	}
	m.a = a
	m.puts++
	return nil
}

func (m *memAnchors) get() Anchor {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.a
}

func (m *memAnchors) failPuts(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.putErr = err
}

func TestAnchorFollowsAppend(t *testing.T) {
	dir := t.TempDir()
	store := &memAnchors{}
	l := openT(t, dir, Options{Anchor: store, MaxFileBytes: 1 << 10})
	if store.puts != 0 {
		t.Fatalf("an empty log was anchored: %+v", store.get())
	}
	for i := range 30 {
		if _, err := l.Append(rec(i)); err != nil {
			t.Fatal(err)
		}
		if a := store.get(); a.Head() != l.Head() || a.File != currentName {
			t.Fatalf("after record %d: anchor %+v, head %+v", i+1, a, l.Head())
		}
	}
	// The anchor names the first record of audit.log, which rotated.
	files, _ := listFiles(dir)
	if len(files) < 2 {
		t.Fatalf("no rotation: %+v", files)
	}
	lines := readLines(t, filepath.Join(dir, currentName))
	if a := store.get(); a.FileFirstSeq != 30-uint64(len(lines))+1 {
		t.Errorf("anchor %+v: audit.log holds the last %d records", a, len(lines))
	}
}

// fiveRecords writes five anchored records and returns the directory, the
// store, and audit.log's lines.
func fiveRecords(t *testing.T) (string, *memAnchors, [][]byte) {
	t.Helper()
	dir, store := t.TempDir(), &memAnchors{}
	appendN(t, dir, Options{Anchor: store}, 0, 5)
	return dir, store, readLines(t, filepath.Join(dir, currentName))
}

// Loss at the end of the log stops Open (daemon start) and fails
// VerifyAnchored, naming the records.
func TestAnchorDetectsLossAtTheEnd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		edit      func(t *testing.T, dir string, lines [][]byte)
		kind      ProblemKind
		seq, last uint64
		msg       string
	}{
		{"truncated to 0", func(t *testing.T, dir string, _ [][]byte) {
			os.Truncate(filepath.Join(dir, currentName), 0)
		}, ProblemTruncated, 1, 5, "records seq 1-5 are missing at the end of the log: the anchor says seq 5 was written to audit.log (which starts at seq 1 and is named audit-00000000000000000001.log once rotated), but the log now holds no record"},
		{"cut after 2 of 5", func(t *testing.T, dir string, l [][]byte) {
			writeLines(t, filepath.Join(dir, currentName), l[:2])
		}, ProblemTruncated, 3, 5, "records seq 3-5 are missing at the end of the log: the anchor says seq 5 was written to audit.log"},
		{"deleted file", func(t *testing.T, dir string, _ [][]byte) {
			os.Remove(filepath.Join(dir, currentName))
		}, ProblemTruncated, 1, 5, "records seq 1-5 are missing at the end"},
		{"last record changed", func(t *testing.T, dir string, l [][]byte) {
			l[4] = bytes.Replace(l[4], []byte(`"outcome":"ok"`), []byte(`"outcome":"no"`), 1)
			writeLines(t, filepath.Join(dir, currentName), l)
		}, ProblemChanged, 5, 0, "the newest record, seq 5, was changed or replaced"},
		{"last record replaced by a forgery", func(t *testing.T, dir string, l [][]byte) {
			writeLines(t, filepath.Join(dir, currentName), append(l[:4], forge(5, lineHash(l[3]))))
		}, ProblemChanged, 5, 0, "the newest record, seq 5, was changed or replaced"},
		{"records appended past the anchor", func(t *testing.T, dir string, l [][]byte) {
			f6 := forge(6, lineHash(l[4]))
			writeLines(t, filepath.Join(dir, currentName), append(l, f6, forge(7, lineHash(f6))))
		}, ProblemUnanchored, 6, 7, "records seq 6-7 run past the anchor (seq 5"},
		{"last two replaced", func(t *testing.T, dir string, l [][]byte) {
			f5 := forge(5, lineHash(l[3]))
			writeLines(t, filepath.Join(dir, currentName), append(l[:4], f5, forge(6, lineHash(f5))))
		}, ProblemUnanchored, 6, 0, "the newest record, seq 6, does not chain to the anchored seq 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, store, lines := fiveRecords(t)
			tc.edit(t, dir, lines)
			_, err := Open(dir, Options{Anchor: store})
			if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "forkd audit reset-anchor --i-know") {
				t.Fatalf("Open: %v\nwant a failed precondition with %q and the fix", err, tc.msg)
			}
			rep, err := VerifyAnchored(dir, store.get())
			if err != nil {
				t.Fatal(err)
			}
			p := rep.Problem
			if rep.OK || p == nil || p.Kind != tc.kind || p.Seq != tc.seq || p.LastSeq != tc.last || !strings.Contains(p.Message, tc.msg) {
				t.Fatalf("VerifyAnchored: %+v problem %+v\nwant kind %s seq %d-%d, message with %q", rep, p, tc.kind, tc.seq, tc.last, tc.msg)
			}
		})
	}
}

// Removing audit.log and the newest rotated file leaves a log whose chain
// is intact but ends early.
func TestAnchorDetectsRemovedNewestFiles(t *testing.T) {
	dir, store := t.TempDir(), &memAnchors{}
	appendN(t, dir, Options{Anchor: store, MaxFileBytes: 1 << 10}, 0, 40)
	files, _ := listFiles(dir)
	newest := files[len(files)-2]
	os.Remove(filepath.Join(dir, currentName))
	os.Remove(filepath.Join(dir, newest.name))
	verifyOK(t, dir, int(newest.nameSeq-1))
	want := fmt.Sprintf("records seq %d-40 are missing at the end of the log", newest.nameSeq)
	if _, err := Open(dir, Options{Anchor: store}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open: %v, want %q", err, want)
	}
	if rep, _ := VerifyAnchored(dir, store.get()); rep.OK || rep.Problem.Seq != newest.nameSeq || rep.Problem.LastSeq != 40 {
		t.Fatalf("VerifyAnchored: %+v", rep.Problem)
	}
}

// A crash between a record's fsync and its anchor leaves the log one
// record ahead: accepted, and the anchor catches up. The log never gets
// further ahead, because Append stores a lagging anchor first.
func TestAnchorOneRecordAhead(t *testing.T) {
	dir, store := t.TempDir(), &memAnchors{}
	l := openT(t, dir, Options{Anchor: store})
	for i := range 4 {
		if _, err := l.Append(rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	broken := errors.New("disk on fire")
	store.failPuts(broken)
	r, err := l.Append(rec(4))
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "record seq 5 is written, but its anchor could not be stored") || r.Seq != 5 {
		t.Fatalf("Append with a failing anchor store: %+v %v", r, err)
	}
	if _, err := l.Append(rec(5)); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "no record is written until it is") {
		t.Fatalf("Append while the anchor lags: %v", err)
	}
	if n := len(readLines(t, filepath.Join(dir, currentName))); n != 5 {
		t.Fatalf("%d records on disk, want 5: the log ran ahead of its anchor", n)
	}
	if a := store.get(); a.Seq != 4 {
		t.Fatalf("anchor %+v", a)
	}
	rep, err := VerifyAnchored(dir, store.get())
	if err != nil || !rep.OK {
		t.Fatalf("one record ahead is a crash, not tampering: %+v %v", rep.Problem, err)
	}
	l.Close()

	store.failPuts(nil)
	l = openT(t, dir, Options{Anchor: store})
	if a := store.get(); a.Head() != l.Head() || a.Seq != 5 {
		t.Fatalf("Open did not bring the anchor up: %+v, head %+v", a, l.Head())
	}
	if r, err := l.Append(rec(5)); err != nil || r.Seq != 6 || store.get().Seq != 6 {
		t.Fatalf("Append after recovery: %+v %v, anchor %+v", r, err, store.get())
	}
}

// A log written before anchors existed (or with a state file started
// afresh) is anchored at its head.
func TestAnchorAdoptsUnanchoredLog(t *testing.T) {
	dir := t.TempDir()
	h := appendN(t, dir, Options{}, 0, 3)
	store := &memAnchors{}
	openT(t, dir, Options{Anchor: store}).Close()
	if a := store.get(); a.Head() != h || a.FileFirstSeq != 1 {
		t.Fatalf("anchor %+v, want head %+v", a, h)
	}
	store.readErr = fmt.Errorf("anchor record: bad JSON: %w", errdefs.ErrFailedPrecondition)
	if _, err := Open(dir, Options{Anchor: store}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "reading its anchor") {
		t.Fatalf("unreadable anchor: %v", err)
	}
}

func TestResetAnchor(t *testing.T) {
	t.Run("cut", func(t *testing.T) {
		dir, store, lines := fiveRecords(t)
		writeLines(t, filepath.Join(dir, currentName), lines[:2])
		res, err := ResetAnchor(dir, Options{Anchor: store}, "uid=0", "no backup")
		if err != nil {
			t.Fatal(err)
		}
		r := res.Record
		if !res.Reset || r == nil || r.Seq != 3 || r.Prev != lineHash(lines[1]) || r.Action != ActionAnchorReset || r.Peer != "uid=0" ||
			r.Detail["missing_first_seq"] != uint64(3) || r.Detail["missing_last_seq"] != uint64(5) || r.Detail["reason"] != "no backup" ||
			r.Detail["anchor_hash"] != lineHash(lines[4]) || res.Problem.Kind != ProblemTruncated {
			t.Fatalf("reset: %+v record %+v", res, r)
		}
		if a := store.get(); a.Head() != res.Head || a.Seq != 3 {
			t.Fatalf("anchor %+v after reset %+v", a, res.Head)
		}
		l := openT(t, dir, Options{Anchor: store})
		if _, err := l.Append(rec(9)); err != nil {
			t.Fatal(err)
		}
		l.Close()
		if rep, err := VerifyAnchored(dir, store.get()); err != nil || !rep.OK || rep.Records != 4 {
			t.Fatalf("after reset: %+v %v", rep, err)
		}
		again, err := ResetAnchor(dir, Options{Anchor: store}, "uid=0", "")
		if err != nil || again.Reset || again.Head.Seq != 4 {
			t.Fatalf("reset of a matching log: %+v %v", again, err)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		dir, store, _ := fiveRecords(t)
		os.Remove(filepath.Join(dir, currentName))
		res, err := ResetAnchor(dir, Options{Anchor: store}, "", "")
		if err != nil || !res.Reset || res.Record.Seq != 1 || res.Record.Prev != Genesis {
			t.Fatalf("reset: %+v %v", res, err)
		}
		verifyOK(t, dir, 1)
		openT(t, dir, Options{Anchor: store}).Close()
	})
	t.Run("unreadable anchor", func(t *testing.T) {
		dir, store, _ := fiveRecords(t)
		store.readErr = fmt.Errorf("bad JSON: %w", errdefs.ErrFailedPrecondition)
		res, err := ResetAnchor(dir, Options{Anchor: store}, "", "")
		if err != nil || !res.Reset || res.Record.Seq != 6 || res.Problem.Kind != ProblemCorrupt {
			t.Fatalf("reset: %+v %v", res, err)
		}
	})
	t.Run("held by a daemon", func(t *testing.T) {
		dir, store, _ := fiveRecords(t)
		openT(t, dir, Options{Anchor: store})
		if _, err := ResetAnchor(dir, Options{Anchor: store}, "", ""); !errdefs.IsUnavailable(err) {
			t.Fatalf("reset while the log is open: %v", err)
		}
	})
}
