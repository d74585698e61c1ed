package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// fileEnd is what Open needs to know about one log file.
type fileEnd struct {
	size     int64
	count    bool   // the file holds at least one record
	first    Head   // seq of the first record and its prev (not its hash)
	last     Head   // seq and hash of the last record
	lastPrev string // the last record's prev
}

// tail is the end of a file: its last complete line and where it ends.
type tail struct {
	last []byte // the last complete line without '\n'; nil when there is none
	cut  int64  // offset after the last '\n' (0 if none); < size when torn
}

var errLongLine = errors.New("line too long")

// readTail finds the last complete line of f by reading backwards from its
// end, never more than two maximal lines.
func readTail(f *os.File, size int64) (tail, error) {
	const limit = 2*MaxLineBytes + 4
	want := int64(64 << 10)
	for {
		want = min(want, size, limit)
		start := size - want
		buf := make([]byte, want)
		if _, err := f.ReadAt(buf, start); err != nil && !errors.Is(err, io.EOF) {
			return tail{}, err
		}
		i := bytes.LastIndexByte(buf, '\n')
		if i < 0 && start == 0 {
			return tail{}, nil
		}
		if i >= 0 {
			j := bytes.LastIndexByte(buf[:i], '\n')
			if j >= 0 || start == 0 {
				return tail{last: buf[j+1 : i], cut: start + int64(i) + 1}, nil
			}
		}
		if want == size || want == limit {
			return tail{}, errLongLine
		}
		want *= 4
	}
}

// damaged is the error for a log file Open cannot continue safely.
func damaged(dir, name string, line int, what, fix string) error {
	return fmt.Errorf("audit log %s line %d %s; run `forkd audit verify --dir %s` to check the chain, then %s: %w",
		filepath.Join(dir, name), line, what, dir, fix, errdefs.ErrFailedPrecondition)
}

const fixAside = "move the damaged file aside or restore it from a backup (nothing is repaired automatically)"

// readEnd reads the first and last record of one log file. A torn final
// line or a line that is not a record is ErrFailedPrecondition.
func readEnd(dir, name string) (fileEnd, error) {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if err != nil {
		return fileEnd{}, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fileEnd{}, fmt.Errorf("audit log: %w", err)
	}
	e := fileEnd{size: st.Size()}
	if e.size == 0 {
		return e, nil
	}
	t, err := readTail(f, e.size)
	if errors.Is(err, errLongLine) {
		return e, damaged(dir, name, countLines(path)+1, fmt.Sprintf("is over %d bytes, not a record", MaxLineBytes), fixAside)
	}
	if err != nil {
		return e, fmt.Errorf("audit log %s: %w", path, err)
	}
	if t.cut != e.size {
		fix := "run `forkd audit repair --dir " + dir + "` to cut the incomplete line (it was never acknowledged; its bytes are kept in " + tornPrefix + "*)"
		if name != currentName {
			fix = fixAside
		}
		return e, damaged(dir, name, countLines(path)+1, "is incomplete (no trailing newline: a crash or a full disk during a write)", fix)
	}
	seq, lastPrev, problem := parseLine(t.last)
	if problem != "" {
		return e, damaged(dir, name, countLines(path), "is not an audit record ("+problem+")", fixAside)
	}
	e.count = true
	e.last, e.lastPrev = Head{Seq: seq, Hash: hashLine(t.last)}, lastPrev

	lr := newLineReader(f)
	l, err := lr.next()
	if err != nil {
		return e, fmt.Errorf("audit log %s: %w", path, err)
	}
	if l.long {
		return e, damaged(dir, name, 1, fmt.Sprintf("is over %d bytes, not a record", MaxLineBytes), fixAside)
	}
	seq, prev, problem := parseLine(l.data)
	if problem != "" {
		return e, damaged(dir, name, 1, "is not an audit record ("+problem+")", fixAside)
	}
	e.first = Head{Seq: seq, Hash: prev}
	return e, nil
}

// RepairResult says what Repair did.
type RepairResult struct {
	// Repaired is false when audit.log had no incomplete final line.
	Repaired bool `json:"repaired"`
	// File and Line locate the incomplete line that was cut.
	File string `json:"file,omitempty"`
	Line int    `json:"line,omitempty"`
	// Bytes is its length; SavedTo is the file that keeps them.
	Bytes   int64  `json:"bytes,omitempty"`
	SavedTo string `json:"saved_to,omitempty"`
}

// Repair cuts an incomplete final line from dir/audit.log: the bytes after
// its last newline, which a crash mid-write left behind and which were never
// acknowledged by Append. The bytes are first saved to audit.log.torn-<ns>.
// It changes nothing else: a record that does not parse or a broken chain
// needs an operator's decision. It takes the directory's lock, so it fails
// while a daemon has the log open.
func Repair(dir string) (RepairResult, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return RepairResult{}, fmt.Errorf("audit log directory %s: %w", dir, errdefs.ErrNotFound)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return RepairResult{}, err
	}
	defer unlock()
	path := filepath.Join(dir, currentName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return RepairResult{}, nil
	}
	if err != nil {
		return RepairResult{}, fmt.Errorf("audit repair: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return RepairResult{}, fmt.Errorf("audit repair: %w", err)
	}
	t, err := readTail(f, st.Size())
	if errors.Is(err, errLongLine) {
		return RepairResult{}, fmt.Errorf("audit repair: %s ends in a line over %d bytes, not an interrupted write; move the file aside instead: %w", path, MaxLineBytes, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return RepairResult{}, fmt.Errorf("audit repair: %w", err)
	}
	if t.cut == st.Size() {
		return RepairResult{}, nil
	}
	res := RepairResult{Repaired: true, File: path, Line: countLines(path) + 1, Bytes: st.Size() - t.cut}
	torn := make([]byte, res.Bytes)
	if _, err := f.ReadAt(torn, t.cut); err != nil && !errors.Is(err, io.EOF) {
		return RepairResult{}, fmt.Errorf("audit repair: %w", err)
	}
	res.SavedTo = filepath.Join(dir, tornPrefix+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := fsutil.WriteFileAtomic(res.SavedTo, torn, 0o600); err != nil {
		return RepairResult{}, fmt.Errorf("audit repair: save the incomplete line: %w", err)
	}
	if err := f.Truncate(t.cut); err != nil {
		return RepairResult{}, fmt.Errorf("audit repair: %w", err)
	}
	if err := f.Sync(); err != nil {
		return RepairResult{}, fmt.Errorf("audit repair: %w", err)
	}
	return res, nil
}
