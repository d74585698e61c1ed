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
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func rec(i int) Record {
	return Record{
		RequestID: fmt.Sprintf("req-%04d", i), Token: "ci", Peer: "uid=0 pid=42",
		Action: "sandbox.fork", Targets: []string{fmt.Sprintf("sb-%04d", i)}, DurationMillis: 1.25,
	}
}

func openT(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// appendN appends n records numbered from start and closes the log.
func appendN(t *testing.T, dir string, opts Options, start, n int) Head {
	t.Helper()
	l := openT(t, dir, opts)
	for i := start; i < start+n; i++ {
		if _, err := l.Append(rec(i)); err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
	}
	h := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return h
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(b, []byte("\n"))[:bytes.Count(b, []byte("\n"))]
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func verifyOK(t *testing.T, dir string, records int) Report {
	t.Helper()
	rep, err := Verify(dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !rep.OK || rep.Records != records {
		t.Fatalf("Verify = ok %v, %d records, problem %+v; want ok with %d records", rep.OK, rep.Records, rep.Problem, records)
	}
	return rep
}

func TestAppendChainsLines(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	var got []Record
	for i := range 3 {
		r, err := l.Append(rec(i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	r, err := l.Append(Record{Action: ActionSandboxDied, Error: "qemu exited"})
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, r)
	lines := readLines(t, filepath.Join(dir, currentName))
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4", len(lines))
	}
	for i, r := range got {
		if r.Seq != uint64(i+1) {
			t.Errorf("record %d: seq %d", i, r.Seq)
		}
		want := Genesis
		if i > 0 {
			want = hashLine(bytes.TrimSuffix(lines[i-1], []byte("\n")))
		}
		if r.Prev != want {
			t.Errorf("record %d: prev %s, want %s", i, r.Prev, want)
		}
		if r.Time.Location() != time.UTC || r.Time.IsZero() {
			t.Errorf("record %d: time %v, want a UTC time", i, r.Time)
		}
	}
	if got[3].Outcome != "internal" || got[0].Outcome != OutcomeOK || got[3].Targets == nil {
		t.Errorf("defaults: %+v", got[3])
	}
	if !bytes.Contains(lines[0], []byte(`"request_id":"req-0000"`)) || !bytes.Contains(lines[3], []byte(`"targets":[]`)) {
		t.Errorf("unexpected encoding:\n%s%s", lines[0], lines[3])
	}
	if h := l.Head(); h.Seq != 4 || h.Hash != hashLine(bytes.TrimSuffix(lines[3], []byte("\n"))) {
		t.Errorf("Head = %+v", h)
	}
}

func TestAppendRejectsAndClose(t *testing.T) {
	l := openT(t, t.TempDir(), Options{})
	if _, err := l.Append(Record{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no action: %v", err)
	}
	if _, err := l.Append(Record{Action: "x", Detail: map[string]any{"c": make(chan int)}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unencodable detail: %v", err)
	}
	r, err := l.Append(Record{Action: "x", Detail: map[string]any{"big": strings.Repeat("a", MaxLineBytes)}})
	if err != nil || r.Detail["detail_dropped_bytes"] == nil || r.Seq != 1 {
		t.Errorf("oversized detail: %+v, %v", r.Detail, err)
	}
	l.Close()
	if _, err := l.Append(rec(1)); !errdefs.IsUnavailable(err) {
		t.Errorf("after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestOpenLocksDir(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	if _, err := Open(dir, Options{}); !errdefs.IsUnavailable(err) {
		t.Fatalf("second Open: %v, want unavailable", err)
	}
	if _, err := Repair(dir); !errdefs.IsUnavailable(err) {
		t.Fatalf("Repair while open: %v, want unavailable", err)
	}
	l.Close()
	openT(t, dir, Options{})
}

func TestConcurrentAppendsKeepChain(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{MaxFileBytes: 8 << 10})
	const workers, each = 8, 40
	var wg sync.WaitGroup
	seqs := make(chan uint64, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				r, err := l.Append(rec(w*each + i))
				if err != nil {
					t.Error(err)
					return
				}
				seqs <- r.Seq
			}
		})
	}
	wg.Wait()
	close(seqs)
	seen := map[uint64]bool{}
	for s := range seqs {
		if seen[s] || s == 0 || s > workers*each {
			t.Fatalf("seq %d repeated or out of range", s)
		}
		seen[s] = true
	}
	rep := verifyOK(t, dir, workers*each)
	if rep.Files < 3 || rep.Head != l.Head() {
		t.Errorf("report %+v, head %+v", rep, l.Head())
	}
}

func TestReopenContinuesChain(t *testing.T) {
	dir := t.TempDir()
	appendN(t, dir, Options{}, 0, 5)
	h := appendN(t, dir, Options{}, 5, 5)
	if h.Seq != 10 {
		t.Fatalf("head %+v", h)
	}
	rep := verifyOK(t, dir, 10)
	if rep.Head != h || rep.Files != 1 {
		t.Errorf("report %+v", rep)
	}
}

func TestRotationKeepsChainAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	const max = 1 << 10
	appendN(t, dir, Options{MaxFileBytes: max}, 0, 20)
	appendN(t, dir, Options{MaxFileBytes: max}, 20, 10)
	files, err := listFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("%d files, want at least 3 rotated and audit.log", len(files))
	}
	next := uint64(1)
	for _, f := range files {
		lines := readLines(t, filepath.Join(dir, f.name))
		if f.rotated && f.nameSeq != next {
			t.Errorf("%s: want first seq %d", f.name, next)
		}
		size := 0
		for _, l := range lines {
			size += len(l)
		}
		if size > max {
			t.Errorf("%s: %d bytes, over %d", f.name, size, max)
		}
		next += uint64(len(lines))
	}
	verifyOK(t, dir, 30)

	// A crash right after the rename leaves no audit.log: Open continues
	// from the newest rotated file.
	last := files[len(files)-1]
	first := files[len(files)-2].nameSeq + uint64(len(readLines(t, filepath.Join(dir, files[len(files)-2].name))))
	if err := os.Rename(filepath.Join(dir, last.name), filepath.Join(dir, rotatedName(first))); err != nil {
		t.Fatal(err)
	}
	appendN(t, dir, Options{MaxFileBytes: max}, 30, 3)
	verifyOK(t, dir, 33)
}

func TestOpenRefusesTornTailUntilRepaired(t *testing.T) {
	dir := t.TempDir()
	appendN(t, dir, Options{}, 0, 3)
	path := filepath.Join(dir, currentName)
	torn := []byte(`{"seq":4,"time":"2026-`)
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(torn)
	f.Close()

	_, err := Open(dir, Options{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), path+" line 4 is incomplete") || !strings.Contains(err.Error(), "forkd audit repair") {
		t.Fatalf("Open: %v", err)
	}
	res, err := Repair(dir)
	if err != nil || !res.Repaired || res.Line != 4 || res.Bytes != int64(len(torn)) {
		t.Fatalf("Repair = %+v, %v", res, err)
	}
	if b, _ := os.ReadFile(res.SavedTo); !bytes.Equal(b, torn) {
		t.Errorf("saved %q, want %q", b, torn)
	}
	if res, err := Repair(dir); err != nil || res.Repaired {
		t.Errorf("second Repair = %+v, %v", res, err)
	}
	appendN(t, dir, Options{}, 3, 1)
	verifyOK(t, dir, 4)
}

func TestOpenRefusesDamagedEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(lines [][]byte) [][]byte
		want string
	}{
		{"last line garbage", func(l [][]byte) [][]byte { l[2] = []byte("garbage\n"); return l }, "line 3 is not an audit record"},
		{"first line garbage", func(l [][]byte) [][]byte { l[0] = []byte("{}\n"); return l }, "line 1 is not an audit record"},
		{"first records cut", func(l [][]byte) [][]byte { return l[1:] }, "line 1 (seq 2) is not the first record"},
		{"only a torn line", func(l [][]byte) [][]byte { return [][]byte{[]byte("{")} }, "line 1 is incomplete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			appendN(t, dir, Options{}, 0, 3)
			path := filepath.Join(dir, currentName)
			writeLines(t, path, tc.edit(readLines(t, path)))
			_, err := Open(dir, Options{})
			if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "forkd audit verify") {
				t.Fatalf("Open: %v; want failed precondition with %q", err, tc.want)
			}
		})
	}
}

func TestOpenRefusesBrokenFileBoundary(t *testing.T) {
	dir := t.TempDir()
	appendN(t, dir, Options{MaxFileBytes: 1 << 10}, 0, 12)
	files, _ := listFiles(dir)
	for _, f := range files {
		if f.rotated {
			os.Remove(filepath.Join(dir, f.name))
		}
	}
	_, err := Open(dir, Options{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no rotated file holds the records before it") {
		t.Fatalf("Open: %v", err)
	}
}

func TestOpenRejectsNegativeSize(t *testing.T) {
	if _, err := Open(t.TempDir(), Options{MaxFileBytes: -1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestTail(t *testing.T) {
	dir := t.TempDir()
	if _, err := Tail(filepath.Join(dir, "nope"), 3); !errdefs.IsNotFound(err) {
		t.Errorf("missing dir: %v", err)
	}
	appendN(t, dir, Options{MaxFileBytes: 1 << 10}, 0, 25)
	f, _ := os.OpenFile(filepath.Join(dir, currentName), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":26`) // a write in progress
	f.Close()
	for _, n := range []int{1, 10, 25, 100} {
		recs, err := Tail(dir, n)
		if err != nil {
			t.Fatal(err)
		}
		want := min(n, 25)
		if len(recs) != want {
			t.Fatalf("Tail %d: %d records", n, len(recs))
		}
		for i, r := range recs {
			if r.Seq != uint64(25-want+i+1) {
				t.Fatalf("Tail %d: record %d has seq %d", n, i, r.Seq)
			}
		}
	}
}
