package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/forkd-dev/forkd/internal/audit"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestAuditAnchorRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if a, err := s.AuditAnchor(); err != nil || a != (audit.Anchor{}) {
		t.Fatalf("anchor of a new state file: %+v %v", a, err)
	}
	want := audit.Anchor{Seq: 7, Hash: strings.Repeat("ab", 32), File: "audit.log", FileFirstSeq: 3}
	if err := s.PutAuditAnchor(want); err != nil {
		t.Fatal(err)
	}
	if a, err := s.AuditAnchor(); err != nil || a != want {
		t.Fatalf("anchor %+v %v, want %+v", a, err, want)
	}

	// Offline readers wait for the daemon's lock, then give up.
	if _, err := ReadAuditAnchor(path, 50*time.Millisecond); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "stop the daemon") {
		t.Fatalf("read-only open while held: %v", err)
	}
	s.Close()
	if a, err := ReadAuditAnchor(path, time.Second); err != nil || a != want {
		t.Fatalf("read-only: %+v %v", a, err)
	}
	s = open(t, path) // Open still accepts a file with the extra bucket
	if a, err := s.AuditAnchor(); err != nil || a != want {
		t.Fatalf("after reopen: %+v %v", a, err)
	}

	if _, err := ReadAuditAnchor(filepath.Join(t.TempDir(), "none.db"), time.Second); !errdefs.IsNotFound(err) {
		t.Fatalf("missing state file: %v", err)
	}
}

func TestAuditAnchorUnreadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	s.db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucketIfNotExists(auditAnchorBucket)
		return b.Put(auditAnchorKey, []byte(`{"seq":"x"}`))
	})
	if _, err := s.AuditAnchor(); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "reset-anchor --i-know") {
		t.Fatalf("unreadable anchor: %v", err)
	}
	s.Close()
	if _, err := ReadAuditAnchor(path, time.Second); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("unreadable anchor, read-only: %v", err)
	}
	os.WriteFile(path, nil, 0o600)
	if _, err := ReadAuditAnchor(path, time.Second); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("empty state file: %v", err)
	}
}

// The daemon's sequence with the real store: each start opens the state
// file, then the log with the state file as its anchor. A log cut or
// deleted between two starts stops the second; reset-anchor lets it go on.
func TestAuditLogAnchoredInState(t *testing.T) {
	dir := t.TempDir()
	statePath, logDir := filepath.Join(dir, "state.db"), filepath.Join(dir, "audit")
	run := func(n int) (audit.Head, error) {
		s, err := Open(statePath)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l, err := audit.Open(logDir, audit.Options{Anchor: s})
		if err != nil {
			return audit.Head{}, err
		}
		defer l.Close()
		for range n {
			if _, err := l.Append(audit.Record{Action: "sandbox.kill", Targets: []string{"sb-1"}}); err != nil {
				t.Fatal(err)
			}
		}
		return l.Head(), nil
	}
	if _, err := run(5); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(logDir, "audit.log")
	data, _ := os.ReadFile(logFile)
	lines := strings.SplitAfter(string(data), "\n")
	os.WriteFile(logFile, []byte(lines[0]+lines[1]), 0o600) // cut after 2 of 5
	if _, err := run(0); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "records seq 3-5 are missing at the end of the log") {
		t.Fatalf("start after a cut: %v", err)
	}
	a, err := ReadAuditAnchor(statePath, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := audit.VerifyAnchored(logDir, a); err != nil || rep.OK || rep.Problem.Kind != audit.ProblemTruncated {
		t.Fatalf("verify after a cut: %+v %v", rep, err)
	}

	s, err := Open(statePath)
	if err != nil {
		t.Fatal(err)
	}
	res, err := audit.ResetAnchor(logDir, audit.Options{Anchor: s}, "uid=0", "test")
	s.Close()
	if err != nil || !res.Reset || res.Record.Seq != 3 {
		t.Fatalf("reset: %+v %v", res, err)
	}
	h, err := run(1)
	if err != nil || h.Seq != 4 {
		t.Fatalf("start after reset: %+v %v", h, err)
	}

	os.Remove(logFile) // deleted
	if _, err := run(0); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "records seq 1-4 are missing") {
		t.Fatalf("start after audit.log was deleted: %v", err)
	}
}
