package audit

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// DefaultMaxFileBytes is the rotation size when Options.MaxFileBytes is 0.
const DefaultMaxFileBytes = 64 << 20

// Options configure Open.
type Options struct {
	// MaxFileBytes is the size audit.log may reach before it is rotated;
	// 0 means DefaultMaxFileBytes. A record longer than it gets a file of its
	// own.
	MaxFileBytes int64
	// Anchor, if set, keeps the log's head outside the log (the daemon's
	// state file). Open compares the log's end with the stored anchor and
	// fails on records cut from the end (audit.log deleted or emptied, the
	// newest rotated files removed), a changed newest record, or records
	// appended past it by someone else; see Anchor. Append stores the
	// anchor after every record.
	Anchor AnchorStore
	// Logger receives rotation notices; nil discards them.
	Logger *slog.Logger
}

// Log appends records to one log directory. Its methods are safe for
// concurrent use. Only one Log (one process) may have a directory open.
type Log struct {
	dir    string
	max    int64
	log    *slog.Logger
	unlock func()

	anchors AnchorStore // nil: no anchor kept

	// mu guards the fields below and serialises writes.
	mu       sync.Mutex
	f        *os.File // audit.log, O_APPEND; nil when closed or after a rotation
	size     int64    // bytes in audit.log
	first    uint64   // seq of audit.log's first record; 0 while it has none
	head     Head     // the newest record
	headPrev string   // the newest record's prev
	err      error    // sticky: a write whose outcome is unknown
	// anchorBehind: the anchor of head could not be stored; the next
	// Append stores it before it writes anything.
	anchorBehind bool
	closed       bool
}

// Open opens the log in dir, creating dir (0700) if needed, and recovers the
// newest record from the end of audit.log (or, when audit.log is empty or
// missing after a rotation, of the newest rotated file). It reads the file
// ends only; `forkd audit verify` checks the whole chain.
//
// An incomplete final line, a line that is not a record, an audit.log that
// does not chain to the newest rotated file (or, with no rotated file, does
// not start at seq 1) or a log that does not match the anchor in
// opts.Anchor (see compareAnchor) is errdefs.ErrFailedPrecondition, naming
// the file or the missing records and the fix. A directory another process
// holds is errdefs.ErrUnavailable.
//
// With opts.Anchor, a log one record past its anchor (a crash between the
// record and the anchor's update) is anchored at its newest record, and so
// is a log with no anchor stored yet (the first start with an anchor
// store, or a state file replaced by an empty one): the latter is logged
// as a warning, since records cut before it cannot be detected.
func Open(dir string, opts Options) (*Log, error) {
	return open(dir, opts, true)
}

// open is Open; without checkAnchor the anchor is neither compared nor
// updated (ResetAnchor decides what to do about a mismatch).
func open(dir string, opts Options, checkAnchor bool) (_ *Log, err error) {
	if opts.MaxFileBytes < 0 {
		return nil, fmt.Errorf("audit log max file size %d: %w", opts.MaxFileBytes, errdefs.ErrInvalidArgument)
	}
	l := &Log{dir: dir, max: opts.MaxFileBytes, log: opts.Logger, anchors: opts.Anchor}
	if l.max == 0 {
		l.max = DefaultMaxFileBytes
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	l.unlock = unlock
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	if err := l.recover(); err != nil {
		return nil, err
	}
	if checkAnchor {
		if err := l.checkAnchor(); err != nil {
			return nil, err
		}
	}
	if err := l.openCurrent(); err != nil {
		return nil, err
	}
	return l, nil
}

// recover sets head, first and size from the ends of the newest files.
func (l *Log) recover() error {
	files, err := listFiles(l.dir)
	if err != nil {
		return err
	}
	rotated, cur := files[:len(files)-1], files[len(files)-1]
	var prevName string
	if len(rotated) > 0 {
		prevName = rotated[len(rotated)-1].name
		e, err := readEnd(l.dir, prevName)
		if err != nil {
			return err
		}
		if !e.count {
			return damaged(l.dir, prevName, 1, "is missing: the rotated file is empty (rotation never leaves one empty)", fixAside)
		}
		l.head, l.headPrev = e.last, e.lastPrev
	}
	if cur.notFound {
		return nil
	}
	e, err := readEnd(l.dir, currentName)
	if err != nil {
		return err
	}
	l.size = e.size
	if !e.count {
		return nil
	}
	if want := l.head.Seq + 1; e.first.Seq != want || e.first.Hash != l.prev() {
		what := fmt.Sprintf("(seq %d) does not chain to seq %d, the last record of %s", e.first.Seq, l.head.Seq, prevName)
		if prevName == "" {
			what = fmt.Sprintf("(seq %d) is not the first record of the log and no rotated file holds the records before it", e.first.Seq)
		}
		return damaged(l.dir, currentName, 1, what, "restore the missing rotated files, or move the whole directory aside to start a new chain")
	}
	l.head, l.headPrev, l.first = e.last, e.lastPrev, e.first.Seq
	return nil
}

// checkAnchor compares the recovered head with the stored anchor, and
// brings the anchor up to the head when the log is legitimately ahead of it
// (see Open).
func (l *Log) checkAnchor() error {
	if l.anchors == nil {
		return nil
	}
	a, err := l.anchors.AuditAnchor()
	if err != nil {
		return fmt.Errorf("audit log %s: reading its anchor: %w", l.dir, err)
	}
	if p := compareAnchor(l.head, l.headPrev, a); p != nil {
		return anchorError(l.dir, p)
	}
	if a.Seq == l.head.Seq {
		return nil
	}
	if a.Seq == 0 {
		l.log.Warn("the audit log has no anchor in the state file yet: anchoring it at its newest record; records cut from its end before now cannot be detected",
			"dir", l.dir, "seq", l.head.Seq)
	}
	if err := l.storeAnchor(); err != nil {
		return fmt.Errorf("audit log %s: storing its anchor (seq %d): %w", l.dir, l.head.Seq, err)
	}
	return nil
}

// storeAnchor stores head as the anchor. Caller holds mu (or owns l).
func (l *Log) storeAnchor() error {
	return l.anchors.PutAuditAnchor(Anchor{Seq: l.head.Seq, Hash: l.head.Hash, File: currentName, FileFirstSeq: l.first})
}

// prev is the Prev of the next record. Caller holds mu (or owns l).
func (l *Log) prev() string {
	if l.head.Seq == 0 {
		return Genesis
	}
	return l.head.Hash
}

// openCurrent opens (creating) audit.log for appending. Caller holds mu.
func (l *Log) openCurrent() error {
	f, err := os.OpenFile(filepath.Join(l.dir, currentName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w: %w", err, errdefs.ErrUnavailable)
	}
	if err := fsutil.SyncDir(l.dir); err != nil {
		f.Close()
		return fmt.Errorf("audit log: sync %s: %w: %w", l.dir, err, errdefs.ErrUnavailable)
	}
	l.f = f
	return nil
}

// Append assigns r the next Seq and the Prev that chains it to the newest
// record, writes it as one line with a single write(2) and fsyncs the file
// before it returns the record as written. Time defaults to now, Outcome to
// OutcomeOK (or "internal" when Error is set); an empty Action is
// errdefs.ErrInvalidArgument. I/O failures are errdefs.ErrUnavailable; after
// one that may have left a partial record, every later Append fails too, and
// the next Open reports what is on disk.
//
// With an anchor store, the record's anchor is stored after the fsync. If
// that fails, Append returns the record (it is durable) with an
// errdefs.ErrUnavailable error, and the next Append stores the anchor
// before it writes anything, failing without writing while it cannot: the
// log never runs more than one record past its anchor.
func (l *Log) Append(r Record) (Record, error) {
	if r.Action == "" {
		return Record{}, fmt.Errorf("audit record without an action: %w", errdefs.ErrInvalidArgument)
	}
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	if r.Outcome == "" {
		r.Outcome = OutcomeOK
		if r.Error != "" {
			r.Outcome = errdefs.Code(errdefs.ErrInternal)
		}
	}
	if r.Targets == nil {
		r.Targets = []string{}
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Record{}, fmt.Errorf("audit log %s is closed: %w", l.dir, errdefs.ErrUnavailable)
	}
	if l.err != nil {
		return Record{}, l.err
	}
	if l.anchorBehind {
		if err := l.storeAnchor(); err != nil {
			return Record{}, fmt.Errorf("audit log %s: the anchor of record seq %d still cannot be stored in the state file (%v); no record is written until it is: %w",
				l.dir, l.head.Seq, err, errdefs.ErrUnavailable)
		}
		l.anchorBehind = false
	}
	r.Seq, r.Prev = l.head.Seq+1, l.prev()
	line, err := encode(&r)
	if err != nil {
		return Record{}, err
	}
	if l.size > 0 && l.size+int64(len(line))+1 > l.max {
		if err := l.rotate(); err != nil {
			return Record{}, err
		}
	}
	if l.f == nil {
		if err := l.openCurrent(); err != nil {
			return Record{}, err
		}
	}
	path := filepath.Join(l.dir, currentName)
	n, err := l.f.Write(append(line, '\n'))
	if err != nil {
		if n > 0 {
			if terr := l.f.Truncate(l.size); terr != nil {
				l.err = fmt.Errorf("audit log %s: a partial record may remain after %v (and %v); no more records until a restart: %w", path, err, terr, errdefs.ErrUnavailable)
			}
		}
		return Record{}, fmt.Errorf("audit log write %s: %w: %w", path, err, errdefs.ErrUnavailable)
	}
	if err := l.f.Sync(); err != nil {
		l.err = fmt.Errorf("audit log %s: fsync failed (%v), record seq %d may be lost; no more records until a restart: %w", path, err, r.Seq, errdefs.ErrUnavailable)
		return Record{}, l.err
	}
	l.size += int64(n)
	l.head, l.headPrev = Head{Seq: r.Seq, Hash: hashLine(line)}, r.Prev
	if l.first == 0 {
		l.first = r.Seq
	}
	if l.anchors != nil {
		// After the fsync, never before: the anchor must not name a
		// record a crash could lose.
		if err := l.storeAnchor(); err != nil {
			l.anchorBehind = true
			return r, fmt.Errorf("audit log %s: record seq %d is written, but its anchor could not be stored in the state file (%v); the next record waits until it is: %w",
				l.dir, r.Seq, err, errdefs.ErrUnavailable)
		}
	}
	return r, nil
}

// rotate renames audit.log to its rotated name. The next write creates a new
// audit.log. Caller holds mu.
func (l *Log) rotate() error {
	from := filepath.Join(l.dir, currentName)
	to := filepath.Join(l.dir, rotatedName(l.first))
	if _, err := os.Lstat(to); err == nil {
		return fmt.Errorf("audit log rotation: %s already exists; move it aside: %w", to, errdefs.ErrFailedPrecondition)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("audit log rotation: %w: %w", err, errdefs.ErrUnavailable)
	}
	if l.f != nil {
		l.f.Close() // every record in it is already fsynced
		l.f = nil
	}
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("audit log rotation: %w: %w", err, errdefs.ErrUnavailable)
	}
	l.size, l.first = 0, 0
	if err := fsutil.SyncDir(l.dir); err != nil {
		l.err = fmt.Errorf("audit log rotation: sync %s: %v; no more records until a restart: %w", l.dir, err, errdefs.ErrUnavailable)
		return l.err
	}
	l.log.Info("audit log rotated", "file", to, "last_seq", l.head.Seq)
	return nil
}

// Head returns the newest record's seq and hash (with Options.Anchor, the
// anchor is kept up to date by Append).
func (l *Log) Head() Head {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

// Dir returns the log's directory.
func (l *Log) Dir() string { return l.dir }

// Close closes the log and releases the directory. Append fails afterwards;
// a second Close is a no-op.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var err error
	if l.f != nil {
		err = l.f.Close()
		l.f = nil
	}
	l.unlock()
	return err
}
