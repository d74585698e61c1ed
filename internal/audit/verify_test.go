package audit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// forge returns a well-formed record line with the given seq and prev.
func forge(seq uint64, prev string) []byte {
	return fmt.Appendf(nil, `{"seq":%d,"time":"2026-01-02T03:04:05Z","request_id":"evil","token":"x","peer":"","action":"sandbox.kill","targets":[],"outcome":"ok","duration_ms":1,"prev":"%s"}`+"\n", seq, prev)
}

func lineHash(l []byte) string { return hashLine(bytes.TrimSuffix(l, []byte("\n"))) }

func TestVerifyNamesTampering(t *testing.T) {
	// Ten records in audit.log; lines[i] holds seq i+1.
	for _, tc := range []struct {
		name      string
		edit      func(l [][]byte) [][]byte
		kind      ProblemKind
		seq, last uint64
		line      int
		msg       string
	}{
		{"changed field", func(l [][]byte) [][]byte {
			l[4] = bytes.Replace(l[4], []byte(`"outcome":"ok"`), []byte(`"outcome":"not_found"`), 1)
			return l
		}, ProblemChanged, 5, 0, 5, "record seq 5 at audit.log line 5 was changed"},
		{"changed prev", func(l [][]byte) [][]byte {
			l[4] = bytes.Replace(l[4], []byte(lineHash(l[3])), []byte(lineHash(l[2])), 1)
			return l
		}, ProblemChanged, 5, 0, 5, "record seq 5 at audit.log line 5 was changed"},
		{"changed seq", func(l [][]byte) [][]byte {
			l[4] = bytes.Replace(l[4], []byte(`"seq":5,`), []byte(`"seq":50,`), 1)
			return l
		}, ProblemChanged, 50, 0, 5, "claims seq 50 instead of 5"},
		{"changed first record", func(l [][]byte) [][]byte {
			l[0] = bytes.Replace(l[0], []byte(`"token":"ci"`), []byte(`"token":"cj"`), 1)
			return l
		}, ProblemChanged, 1, 0, 1, "record seq 1 at audit.log line 1 was changed"},
		{"removed one", func(l [][]byte) [][]byte { return slices.Delete(l, 4, 5) },
			ProblemRemoved, 5, 5, 5, "record seq 5 is missing: removed between seq 4 at audit.log line 4 and seq 6"},
		{"removed three", func(l [][]byte) [][]byte { return slices.Delete(l, 3, 6) },
			ProblemRemoved, 4, 6, 4, "records seq 4-6 are missing"},
		{"removed first", func(l [][]byte) [][]byte { return l[1:] },
			ProblemMissingFile, 1, 1, 1, "record seq 1 is missing before audit.log line 1"},
		{"inserted forgery that chains", func(l [][]byte) [][]byte {
			return slices.Insert(l, 5, forge(6, lineHash(l[4])))
		}, ProblemInserted, 6, 0, 6, "audit.log line 6 (seq 6) was inserted"},
		{"inserted copy", func(l [][]byte) [][]byte { return slices.Insert(l, 5, l[1]) },
			ProblemInserted, 2, 0, 6, "audit.log line 6 (claiming seq 2) was inserted: seq 6 at audit.log line 7 chains directly to seq 5"},
		{"inserted two", func(l [][]byte) [][]byte { return slices.Insert(l, 5, forge(77, Genesis), forge(78, Genesis)) },
			ProblemInserted, 77, 0, 6, "2 lines from audit.log line 6"},
		{"inserted copy at start", func(l [][]byte) [][]byte { return slices.Insert(l, 0, l[2]) },
			ProblemInserted, 3, 0, 1, "chains directly to the start of the log"},
		{"inserted duplicate of previous", func(l [][]byte) [][]byte { return slices.Insert(l, 5, l[4]) },
			ProblemInserted, 5, 0, 6, "audit.log line 6 is a copy of seq 5"},
		{"inserted forgery at end", func(l [][]byte) [][]byte { return append(l, forge(3, Genesis)) },
			ProblemInserted, 3, 0, 11, "audit.log line 11 (claiming seq 3, which comes earlier) was inserted"},
		{"swapped", func(l [][]byte) [][]byte { l[3], l[4] = l[4], l[3]; return l },
			ProblemReordered, 5, 0, 4, "seq 5 at audit.log line 4 comes before seq 4 at audit.log line 5"},
		{"moved back", func(l [][]byte) [][]byte { r := l[7]; return slices.Insert(slices.Delete(l, 7, 8), 2, r) },
			ProblemReordered, 8, 0, 3, "seq 8 at audit.log line 3 comes before seq 3"},
		{"torn last line", func(l [][]byte) [][]byte { l[9] = l[9][:40]; return l },
			ProblemTorn, 0, 0, 10, "audit.log line 10 is incomplete"},
		{"garbage line", func(l [][]byte) [][]byte { l[6] = []byte("hello\n"); return l },
			ProblemCorrupt, 0, 0, 7, "audit.log line 7 is not an audit record"},
		{"blank line", func(l [][]byte) [][]byte { return slices.Insert(l, 3, []byte("\n")) },
			ProblemCorrupt, 0, 0, 4, "audit.log line 4 is not an audit record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			appendN(t, dir, Options{}, 0, 10)
			path := filepath.Join(dir, currentName)
			writeLines(t, path, tc.edit(readLines(t, path)))
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			p := rep.Problem
			if rep.OK || p == nil {
				t.Fatalf("Verify OK after tampering: %+v", rep)
			}
			if want := tc.line - 1; (tc.kind == ProblemChanged || tc.kind == ProblemRemoved) && rep.Records != want {
				t.Errorf("%d records verified before the problem, want %d", rep.Records, want)
			}
			if p.Kind != tc.kind || p.Seq != tc.seq || p.LastSeq != tc.last || p.File != currentName || p.Line != tc.line || !strings.Contains(p.Message, tc.msg) {
				t.Fatalf("problem %+v\nwant kind %s seq %d last %d line %d, message containing %q", p, tc.kind, tc.seq, tc.last, tc.line, tc.msg)
			}
		})
	}
}

// The chain alone cannot see a cut or a change at its very end; the
// anchor does (anchor_test.go covers the cases one by one).
func TestVerifyHeadAnchorsTheEnd(t *testing.T) {
	dir := t.TempDir()
	store := &memAnchors{}
	h := appendN(t, dir, Options{Anchor: store}, 0, 5)
	if store.get().Head() != h {
		t.Fatalf("anchor %+v, head %+v", store.get(), h)
	}
	path := filepath.Join(dir, currentName)
	lines := readLines(t, path)
	writeLines(t, path, lines[:4])
	verifyOK(t, dir, 4) // the chain of what is left is intact...
	rep, err := VerifyAnchored(dir, store.get())
	if err != nil {
		t.Fatal(err)
	}
	if p := rep.Problem; rep.OK || p == nil || p.Kind != ProblemTruncated || p.Seq != 5 || p.LastSeq != 5 ||
		!strings.Contains(p.Message, "record seq 5 is missing at the end of the log") || rep.Anchor == nil || rep.Records != 4 {
		t.Fatalf("...but not what the anchor says: %+v problem %+v", rep, rep.Problem)
	}
	if _, err := Open(dir, Options{Anchor: store}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Open with anchor after a cut: %v", err)
	}
}

// rotatedLog writes 40 records into at least four files and returns them
// in chain order.
func rotatedLog(t *testing.T) (string, []logFile) {
	t.Helper()
	dir := t.TempDir()
	appendN(t, dir, Options{MaxFileBytes: 1 << 10}, 0, 40)
	files, err := listFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 5 {
		t.Fatalf("%d files, want at least 4 rotated and audit.log", len(files))
	}
	verifyOK(t, dir, 40)
	return dir, files
}

func TestVerifyRotatedFiles(t *testing.T) {
	t.Run("middle file removed", func(t *testing.T) {
		dir, files := rotatedLog(t)
		os.Remove(filepath.Join(dir, files[1].name))
		rep, _ := Verify(dir)
		p := rep.Problem
		want := fmt.Sprintf("records seq %d-%d are missing between the end of %s (seq %d", files[1].nameSeq, files[2].nameSeq-1, files[0].name, files[1].nameSeq-1)
		if p == nil || p.Kind != ProblemMissingFile || p.Seq != files[1].nameSeq || p.LastSeq != files[2].nameSeq-1 ||
			p.File != files[2].name || p.Line != 1 || !strings.Contains(p.Message, want) || !strings.Contains(p.Message, "rotated file "+files[1].name+" was removed") {
			t.Fatalf("problem %+v, want message with %q", p, want)
		}
		if rep.Records != int(files[1].nameSeq-1) || rep.Files != len(files)-1 {
			t.Errorf("report %+v", rep)
		}
	})
	t.Run("oldest file removed", func(t *testing.T) {
		dir, files := rotatedLog(t)
		os.Remove(filepath.Join(dir, files[0].name))
		rep, _ := Verify(dir)
		if p := rep.Problem; p == nil || p.Kind != ProblemMissingFile || p.Seq != 1 || p.LastSeq != files[1].nameSeq-1 || p.File != files[1].name {
			t.Fatalf("problem %+v", p)
		}
	})
	t.Run("record changed at file end", func(t *testing.T) {
		dir, files := rotatedLog(t)
		path := filepath.Join(dir, files[1].name)
		lines := readLines(t, path)
		n := len(lines)
		lines[n-1] = bytes.Replace(lines[n-1], []byte(`"peer":"uid=0 pid=42"`), []byte(`"peer":"uid=1 pid=42"`), 1)
		writeLines(t, path, lines)
		rep, _ := Verify(dir)
		seq := files[2].nameSeq - 1
		if p := rep.Problem; p == nil || p.Kind != ProblemChanged || p.Seq != seq || p.File != files[1].name || p.Line != n || rep.Records != int(seq-1) ||
			!strings.Contains(p.Message, fmt.Sprintf("does not match the prev of seq %d at %s line 1", seq+1, files[2].name)) {
			t.Fatalf("problem %+v", p)
		}
	})
	t.Run("files swapped", func(t *testing.T) {
		dir, files := rotatedLog(t)
		a, b := filepath.Join(dir, files[0].name), filepath.Join(dir, files[1].name)
		os.Rename(a, a+".tmp")
		os.Rename(b, a)
		os.Rename(a+".tmp", b)
		rep, _ := Verify(dir)
		if p := rep.Problem; p == nil || p.Kind != ProblemReordered || p.File != files[0].name || p.Line != 1 || p.Seq != files[1].nameSeq {
			t.Fatalf("problem %+v", p)
		}
	})
	t.Run("file renamed", func(t *testing.T) {
		dir, files := rotatedLog(t)
		os.Rename(filepath.Join(dir, files[1].name), filepath.Join(dir, rotatedName(files[1].nameSeq+1)))
		rep, _ := Verify(dir)
		if p := rep.Problem; p == nil || p.Kind != ProblemMisnamed || p.Seq != files[1].nameSeq {
			t.Fatalf("problem %+v", p)
		}
	})
	t.Run("rotated file cut", func(t *testing.T) {
		dir, files := rotatedLog(t)
		path := filepath.Join(dir, files[2].name)
		lines := readLines(t, path)
		writeLines(t, path, lines[:len(lines)-1])
		rep, _ := Verify(dir)
		if p := rep.Problem; p == nil || p.Kind != ProblemMissingFile || p.Seq != files[3].nameSeq-1 || p.File != files[3].name {
			t.Fatalf("problem %+v", p)
		}
	})
	t.Run("rotated file torn", func(t *testing.T) {
		dir, files := rotatedLog(t)
		path := filepath.Join(dir, files[2].name)
		b, _ := os.ReadFile(path)
		os.WriteFile(path, b[:len(b)-5], 0o600)
		rep, _ := Verify(dir)
		if p := rep.Problem; p == nil || p.Kind != ProblemTorn || p.File != files[2].name || !strings.Contains(p.Message, "rotated file was cut") {
			t.Fatalf("problem %+v", p)
		}
	})
	t.Run("rotated file emptied", func(t *testing.T) {
		dir, files := rotatedLog(t)
		os.WriteFile(filepath.Join(dir, files[2].name), nil, 0o600)
		rep, _ := Verify(dir)
		if p := rep.Problem; p == nil || p.Kind != ProblemCorrupt || p.File != files[2].name || !strings.Contains(p.Message, "empty") {
			t.Fatalf("problem %+v", p)
		}
	})
}

func TestVerifyEmptyAndMissing(t *testing.T) {
	if _, err := Verify(filepath.Join(t.TempDir(), "nope")); !errdefs.IsNotFound(err) {
		t.Errorf("missing dir: %v", err)
	}
	rep := verifyOK(t, t.TempDir(), 0)
	if rep.Files != 0 {
		t.Errorf("report %+v", rep)
	}
}

// Verify runs next to a live daemon: rotations and writes in progress must
// not be reported as tampering.
func TestVerifyLiveLog(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{MaxFileBytes: 4 << 10})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			if _, err := l.Append(rec(i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for live := true; live; {
		select {
		case <-done:
			live = false
		default:
		}
		rep, err := Verify(dir)
		if err != nil || !rep.OK {
			t.Fatalf("Verify on a live log: %+v, %v", rep.Problem, err)
		}
	}
	verifyOK(t, dir, 300)
}
