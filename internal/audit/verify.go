package audit

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// ProblemKind classifies what Verify found.
type ProblemKind string

const (
	// ProblemChanged: a record's bytes differ from what was written.
	ProblemChanged ProblemKind = "changed"
	// ProblemRemoved: records are missing inside a file.
	ProblemRemoved ProblemKind = "removed"
	// ProblemMissingFile: records are missing at a file boundary, or before
	// the first file: a rotated file was removed (or cut at a line end).
	ProblemMissingFile ProblemKind = "missing_file"
	// ProblemInserted: a record that was never written by the log.
	ProblemInserted ProblemKind = "inserted"
	// ProblemReordered: genuine records in the wrong order.
	ProblemReordered ProblemKind = "reordered"
	// ProblemTorn: a file ends in a line without its newline.
	ProblemTorn ProblemKind = "torn"
	// ProblemCorrupt: a line that is not an audit record, or an empty
	// rotated file.
	ProblemCorrupt ProblemKind = "corrupt"
	// ProblemMisnamed: a rotated file's name does not match its first seq.
	ProblemMisnamed ProblemKind = "misnamed"
)

// Problem is the first thing wrong with a log, located precisely.
type Problem struct {
	Kind ProblemKind `json:"kind"`
	// Seq is the record concerned; with LastSeq, the range of missing records.
	Seq     uint64 `json:"seq,omitempty"`
	LastSeq uint64 `json:"last_seq,omitempty"`
	// File (base name) and Line (1-based) locate the offending line; for a
	// removal, the first line after the gap.
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

// Report is the result of Verify.
type Report struct {
	OK  bool   `json:"ok"`
	Dir string `json:"dir"`
	// Files is the number of log files found.
	Files int `json:"files"`
	// Records is the number of records verified in chain order: all of them
	// when OK, else those before the problem.
	Records int `json:"records"`
	// Head is the newest verified record. VerifyAnchored compares it with
	// the anchor kept in the state file to detect records cut from the
	// end, which the chain cannot.
	Head    Head     `json:"head"`
	Problem *Problem `json:"problem,omitempty"`
	// Anchor is the anchor the log's end was compared with
	// (VerifyAnchored); nil when none was.
	Anchor *Anchor `json:"anchor,omitempty"`

	headPrev string // Head's prev, to recognise a log one record past its anchor
}

// liveRetryDelay is how long Verify waits before it looks again at a torn
// final line of audit.log, which a live daemon may be writing.
var liveRetryDelay = 50 * time.Millisecond

// liveRetries bounds how often Verify looks again.
const liveRetries = 5

// lookahead is how many lines past a break Verify reads to tell an
// insertion or a reordering from a change or a removal.
const lookahead = 1024

// Verify walks every file of the log in dir in chain order, recomputes the
// hash chain and reports the first problem. An error is returned only when
// the log cannot be read (a missing dir is errdefs.ErrNotFound); a broken
// chain is a Report with OK false. It takes no lock and may run next to a
// live daemon: it pins audit.log when it lists the files, so a rotation does
// not look like a missing file, and it looks again at an incomplete final
// line of audit.log, which may be a write in progress.
func Verify(dir string) (Report, error) {
	for try := 0; ; try++ {
		rep, err := verifyOnce(dir)
		if err != nil || rep.OK || try == liveRetries {
			return rep, err
		}
		if p := rep.Problem; p.Kind != ProblemTorn || p.File != currentName {
			return rep, nil
		}
		time.Sleep(liveRetryDelay) // a write in progress, or a crash
	}
}

func verifyOnce(dir string) (Report, error) {
	rep := Report{Dir: dir}
	files, cur, err := pinFiles(dir)
	if err != nil {
		return rep, err
	}
	for _, f := range files {
		if !f.notFound {
			rep.Files++
		}
	}
	w := &walker{dir: dir, files: files, cur: cur}
	defer w.close()
	var last *entry
	var beforeLast Head
	for {
		e, ok, err := w.next()
		if err != nil {
			return rep, err
		}
		if !ok {
			rep.OK = true
			return rep, nil
		}
		if p := lineProblem(e); p != nil {
			rep.Problem = p
			return rep, nil
		}
		expSeq, expPrev := uint64(1), Genesis
		if last != nil {
			expSeq, expPrev = last.seq+1, last.hash
		}
		if e.seq != expSeq || e.prev != expPrev {
			win := []entry{e}
			for len(win) < lookahead {
				n, ok, err := w.next()
				if err != nil {
					return rep, err
				}
				if !ok {
					break
				}
				win = append(win, n)
			}
			rep.Problem = classify(last, win)
			if p := rep.Problem; last != nil && p.File == last.file && p.Line == last.line {
				rep.Records-- // the problem is the record already counted
				rep.Head = beforeLast
			}
			return rep, nil
		}
		if e.line == 1 && e.rotated && e.nameSeq != e.seq {
			rep.Problem = &Problem{Kind: ProblemMisnamed, Seq: e.seq, File: e.file, Line: 1,
				Message: fmt.Sprintf("rotated file %s starts at seq %d, not the seq its name claims (%d): it was renamed", e.file, e.seq, e.nameSeq)}
			return rep, nil
		}
		beforeLast = rep.Head
		last = &e
		rep.Records++
		rep.Head, rep.headPrev = Head{Seq: e.seq, Hash: e.hash}, e.prev
	}
}

// entry is one line of the log as Verify sees it.
type entry struct {
	file    string
	line    int
	rotated bool
	nameSeq uint64 // the first seq a rotated file's name claims
	seq     uint64
	prev    string
	hash    string // hashLine of the line
	torn    bool
	problem string // why the line is not a record
}

func (e *entry) loc() string { return fmt.Sprintf("%s line %d", e.file, e.line) }

// valid reports whether e is a complete, well-formed record.
func (e *entry) valid() bool { return e.problem == "" && !e.torn }

// lineProblem reports a line that is not a record at all.
func lineProblem(e entry) *Problem {
	switch {
	case e.torn && e.file == currentName:
		return &Problem{Kind: ProblemTorn, Seq: e.seq, File: e.file, Line: e.line,
			Message: e.loc() + " is incomplete (no trailing newline): a write was interrupted by a crash or a full disk and never acknowledged; `forkd audit repair` cuts it and keeps its bytes"}
	case e.torn:
		return &Problem{Kind: ProblemTorn, Seq: e.seq, File: e.file, Line: e.line,
			Message: e.loc() + " is incomplete (no trailing newline): the rotated file was cut"}
	case e.problem != "":
		return &Problem{Kind: ProblemCorrupt, File: e.file, Line: e.line,
			Message: e.loc() + " is not an audit record: " + e.problem}
	}
	return nil
}

// classify names the problem where the chain breaks: last is the newest
// verified record (nil at the start of the log) and win[0] the line that does
// not follow it, with up to lookahead lines after it.
//
// Seq and prev together tell the cases apart. A record whose prev is the hash
// of last follows it, whatever its seq says; a later line that does (with the
// right seq) is last's genuine successor, so the lines before it were
// inserted, or moved there if they chain among the genuine records. Without
// such a line, a seq gap is a removal, and a right seq with a wrong prev is a
// change: of last, unless the record after win[0] does not chain to win[0]
// either, which makes win[0] the changed one.
func classify(last *entry, win []entry) *Problem {
	e := &win[0]
	expSeq, expPrev := uint64(1), Genesis
	if last != nil {
		expSeq, expPrev = last.seq+1, last.hash
	}

	// Two records claiming the same place: which one does the next chain to?
	if last != nil && e.seq == last.seq && e.prev == last.prev {
		p := &Problem{Kind: ProblemInserted, Seq: e.seq, File: e.file, Line: e.line}
		if e.hash == last.hash {
			p.Message = fmt.Sprintf("%s is a copy of seq %d at %s: inserted", e.loc(), e.seq, last.loc())
			return p
		}
		for _, n := range win[1:] {
			if !n.valid() || n.seq != e.seq+1 {
				continue
			}
			switch n.prev {
			case e.hash:
				p.File, p.Line = last.file, last.line
				p.Message = fmt.Sprintf("%s (seq %d) was inserted: %s claims the same seq and chains to the same record, and seq %d at %s chains to that one",
					last.loc(), last.seq, e.loc(), n.seq, n.loc())
				return p
			case last.hash:
				p.Message = fmt.Sprintf("%s (seq %d) was inserted: seq %d at %s already holds that place, and seq %d at %s chains to it",
					e.loc(), e.seq, last.seq, last.loc(), n.seq, n.loc())
				return p
			}
			break
		}
		p.Message = fmt.Sprintf("%s and %s both claim seq %d and chain to the same record: one of them was inserted", last.loc(), e.loc(), e.seq)
		return p
	}

	// Is last's genuine successor further on?
	for j := 1; j < len(win); j++ {
		n := &win[j]
		if !n.valid() || n.seq != expSeq || n.prev != expPrev {
			continue
		}
		if e.seq > expSeq && chainsWithin(e, win) {
			return &Problem{Kind: ProblemReordered, Seq: e.seq, File: e.file, Line: e.line,
				Message: fmt.Sprintf("records out of order: seq %d at %s comes before seq %d at %s", e.seq, e.loc(), n.seq, n.loc())}
		}
		after := "the start of the log"
		if last != nil {
			after = fmt.Sprintf("seq %d at %s", last.seq, last.loc())
		}
		what := fmt.Sprintf("%s (claiming seq %d) was inserted", e.loc(), e.seq)
		if j > 1 {
			what = fmt.Sprintf("%d lines from %s (the first claiming seq %d) were inserted", j, e.loc(), e.seq)
		}
		return &Problem{Kind: ProblemInserted, Seq: e.seq, File: e.file, Line: e.line,
			Message: fmt.Sprintf("%s: seq %d at %s chains directly to %s", what, n.seq, n.loc(), after)}
	}

	switch {
	case e.prev == expPrev:
		return &Problem{Kind: ProblemChanged, Seq: e.seq, File: e.file, Line: e.line,
			Message: fmt.Sprintf("record at %s was changed: it chains to the record before it but claims seq %d instead of %d", e.loc(), e.seq, expSeq)}

	case e.seq == expSeq:
		var next *entry
		if len(win) > 1 && win[1].valid() && win[1].seq == e.seq+1 {
			next = &win[1]
		}
		if last == nil || (next != nil && next.prev != e.hash) {
			msg := fmt.Sprintf("record seq %d at %s was changed: its prev does not match the record before it", e.seq, e.loc())
			if next != nil {
				msg += fmt.Sprintf(", and its hash does not match the prev of seq %d at %s", next.seq, next.loc())
			}
			return &Problem{Kind: ProblemChanged, Seq: e.seq, File: e.file, Line: e.line, Message: msg}
		}
		msg := fmt.Sprintf("record seq %d at %s was changed: its hash does not match the prev of seq %d at %s", last.seq, last.loc(), e.seq, e.loc())
		if next == nil {
			msg += fmt.Sprintf(" (or the prev of seq %d, the newest record, was changed)", e.seq)
		}
		return &Problem{Kind: ProblemChanged, Seq: last.seq, File: last.file, Line: last.line, Message: msg}

	case e.seq > expSeq:
		p := &Problem{Kind: ProblemRemoved, Seq: expSeq, LastSeq: e.seq - 1, File: e.file, Line: e.line}
		what := fmt.Sprintf("record seq %d is missing", expSeq)
		if e.seq-1 > expSeq {
			what = fmt.Sprintf("records seq %d-%d are missing", expSeq, e.seq-1)
		}
		switch {
		case last == nil:
			p.Kind = ProblemMissingFile
			p.Message = fmt.Sprintf("%s before %s, the start of the oldest file: the oldest rotated file (%s) was removed, or the start of %s was cut", what, e.loc(), rotatedName(expSeq), e.file)
		case e.line == 1 && last.file != e.file:
			p.Kind = ProblemMissingFile
			p.Message = fmt.Sprintf("%s between the end of %s (seq %d, line %d) and the start of %s: rotated file %s was removed, or a file was cut",
				what, last.file, last.seq, last.line, e.file, rotatedName(expSeq))
		default:
			p.Message = fmt.Sprintf("%s: removed between seq %d at %s and seq %d at %s", what, last.seq, last.loc(), e.seq, e.loc())
		}
		return p

	default:
		return &Problem{Kind: ProblemInserted, Seq: e.seq, File: e.file, Line: e.line,
			Message: fmt.Sprintf("%s (claiming seq %d, which comes earlier) was inserted or replayed after seq %d at %s", e.loc(), e.seq, last.seq, last.loc())}
	}
}

// chainsWithin reports whether x links to a neighbour in win by seq and
// hash while no other line claims its seq, which makes it a genuine record
// in the wrong place rather than a copy.
func chainsWithin(x *entry, win []entry) bool {
	linked := false
	for i := range win {
		y := &win[i]
		if y == x || !y.valid() {
			continue
		}
		if y.seq == x.seq {
			return false
		}
		if (y.hash == x.prev && y.seq+1 == x.seq) || (y.prev == x.hash && y.seq == x.seq+1) {
			linked = true
		}
	}
	return linked
}

// pinFiles lists the files of a log and opens audit.log, the one name a live
// daemon moves: reading it through this descriptor, Verify sees the files
// as listed even if audit.log is rotated meanwhile (rotated files never
// change). It lists again after the open, and starts over if a rotation
// came between.
func pinFiles(dir string) ([]logFile, *os.File, error) {
	for try := 0; ; try++ {
		files, err := listFiles(dir)
		if err != nil {
			return nil, nil, err
		}
		cur, err := os.Open(filepath.Join(dir, currentName))
		if errors.Is(err, fs.ErrNotExist) {
			cur = nil
		} else if err != nil {
			return nil, nil, fmt.Errorf("audit verify: %w", err)
		}
		again, err := listFiles(dir)
		stable := err == nil && slices.Equal(files, again) && (cur == nil) == files[len(files)-1].notFound
		if stable || try == liveRetries {
			return files, cur, nil
		}
		if cur != nil {
			cur.Close()
		}
	}
}

// walker reads the lines of a log's files in chain order.
type walker struct {
	dir   string
	files []logFile
	cur   *os.File // audit.log, pinned by pinFiles; nil when absent
	i     int
	f     *os.File
	lf    logFile
	lr    *lineReader
}

// next returns the next line, or false after the last. An empty rotated
// file yields one line with a problem.
func (w *walker) next() (entry, bool, error) {
	for {
		if w.f == nil {
			if w.i == len(w.files) {
				return entry{}, false, nil
			}
			w.lf = w.files[w.i]
			w.i++
			if !w.lf.rotated {
				if w.cur == nil {
					continue
				}
				w.f, w.cur = w.cur, nil
				w.lr = newLineReader(w.f)
				continue
			}
			f, err := os.Open(filepath.Join(w.dir, w.lf.name))
			if err != nil {
				return entry{}, false, fmt.Errorf("audit verify: %w", err)
			}
			w.f, w.lr = f, newLineReader(f)
		}
		l, err := w.lr.next()
		if errors.Is(err, io.EOF) {
			empty := w.lr.no == 0
			w.f.Close()
			w.f = nil
			if empty && w.lf.rotated {
				return entry{file: w.lf.name, line: 1, rotated: true, nameSeq: w.lf.nameSeq, problem: "the rotated file is empty"}, true, nil
			}
			continue
		}
		if err != nil {
			return entry{}, false, fmt.Errorf("audit verify %s: %w", w.lf.name, err)
		}
		e := entry{file: w.lf.name, line: l.no, rotated: w.lf.rotated, nameSeq: w.lf.nameSeq, hash: l.hash, torn: l.torn}
		if l.long {
			e.problem = fmt.Sprintf("longer than %d bytes", MaxLineBytes)
		} else {
			e.seq, e.prev, e.problem = parseLine(l.data)
		}
		return e, true, nil
	}
}

func (w *walker) close() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	if w.cur != nil {
		w.cur.Close()
		w.cur = nil
	}
}
