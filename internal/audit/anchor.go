package audit

import (
	"fmt"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// ActionAnchorReset is the record `forkd audit reset-anchor` appends when an
// operator accepts a log that no longer matches its anchor (records cut
// from the end, the newest record changed). Its Detail names what the
// anchor said and where the log ended; the records after it form a new
// segment of the chain, anchored again.
const ActionAnchorReset = "audit.anchor_reset"

// Anchor is a log's head kept outside the log directory: the daemon keeps it
// in its state file, next to the sandboxes it records. The hash chain
// cannot show records cut from the end of a log, a deleted audit.log or a
// changed newest record; a log compared with its anchor can.
//
// Append stores the anchor after the record is written and fsynced, and
// writes no further record until the anchor of the previous one is stored.
// So after a crash the log is at most one record ahead of its anchor (a
// record whose prev is the anchor's hash), never behind it.
type Anchor struct {
	// Seq and Hash identify the newest record written (see Head).
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
	// File is the log file the record was written to (audit.log), and
	// FileFirstSeq the seq of that file's first record: the name it gets
	// when it is rotated is rotatedName(FileFirstSeq). Both only make the
	// errors more precise.
	File         string `json:"file"`
	FileFirstSeq uint64 `json:"file_first_seq"`
}

// Head returns the anchored record's seq and hash.
func (a Anchor) Head() Head { return Head{Seq: a.Seq, Hash: a.Hash} }

// AnchorStore keeps a log's anchor; *state.Store is one. Both methods must
// be safe for concurrent use.
type AnchorStore interface {
	// AuditAnchor returns the stored anchor, or the zero Anchor when none
	// was ever stored. A stored anchor that cannot be read is an
	// errdefs.ErrFailedPrecondition.
	AuditAnchor() (Anchor, error)
	// PutAuditAnchor replaces the stored anchor and returns once it is
	// durable.
	PutAuditAnchor(Anchor) error
}

// ProblemTruncated: records are missing at the end of the log, which ends
// before its anchor (cut, audit.log deleted or emptied, the newest rotated
// files removed).
const ProblemTruncated ProblemKind = "truncated"

// ProblemUnanchored: the log runs more than one record past its anchor, or
// its one extra record does not chain to the anchored one: the records
// after the anchor were not written by the daemon that keeps it (or the
// state file is an older copy).
const ProblemUnanchored ProblemKind = "unanchored"

// compareAnchor reports how a log whose newest record is head (and whose
// prev is headPrev) differs from its anchor a, or nil when it matches: it
// ends at the anchor, or one record past it with that record chained to the
// anchored one (a crash between the record's fsync and the anchor's
// update). The zero Anchor (none stored) matches every log.
func compareAnchor(head Head, headPrev string, a Anchor) *Problem {
	where := "written"
	if a.File != "" {
		where = "written to " + a.File
		if a.FileFirstSeq > 0 {
			where += fmt.Sprintf(" (which starts at seq %d and is named %s once rotated)", a.FileFirstSeq, rotatedName(a.FileFirstSeq))
		}
	}
	switch {
	case a.Seq == 0:
		return nil
	case head.Seq < a.Seq:
		what := fmt.Sprintf("record seq %d is missing", a.Seq)
		if a.Seq-head.Seq > 1 {
			what = fmt.Sprintf("records seq %d-%d are missing", head.Seq+1, a.Seq)
		}
		ends := fmt.Sprintf("the log now ends at seq %d", head.Seq)
		if head.Seq == 0 {
			ends = "the log now holds no record (audit.log deleted or emptied, and no rotated file left)"
		}
		return &Problem{Kind: ProblemTruncated, Seq: head.Seq + 1, LastSeq: a.Seq,
			Message: fmt.Sprintf("%s at the end of the log: the anchor says seq %d was %s, but %s", what, a.Seq, where, ends)}
	case head.Seq == a.Seq && head.Hash != a.Hash:
		return &Problem{Kind: ProblemChanged, Seq: a.Seq,
			Message: fmt.Sprintf("the newest record, seq %d, was changed or replaced: its hash is %s, the anchor says %s was %s", a.Seq, head.Hash, a.Hash, where)}
	case head.Seq == a.Seq:
		return nil
	case head.Seq == a.Seq+1 && headPrev == a.Hash:
		return nil
	case head.Seq == a.Seq+1:
		return &Problem{Kind: ProblemUnanchored, Seq: head.Seq,
			Message: fmt.Sprintf("the newest record, seq %d, does not chain to the anchored seq %d (hash %s, %s): seq %d was changed, or both were replaced", head.Seq, a.Seq, a.Hash, where, a.Seq)}
	default:
		return &Problem{Kind: ProblemUnanchored, Seq: a.Seq + 1, LastSeq: head.Seq,
			Message: fmt.Sprintf("records seq %d-%d run past the anchor (seq %d, %s), more than the one record a crash can leave: they were not appended by the daemon that keeps the anchor, or the state file is an older copy",
				a.Seq+1, head.Seq, a.Seq, where)}
	}
}

// anchorError is Open's error for a log that does not match its anchor.
func anchorError(dir string, p *Problem) error {
	return fmt.Errorf("audit log %s does not match its anchor in the state file: %s. forkd does not start on it, so the loss is not silent. "+
		"Restore the missing or changed files (audit.log, audit-*.log) from a backup and start again; or, to accept the log as it is, "+
		"stop here and run `forkd audit reset-anchor --i-know`, which appends an %s record naming what the anchor said and starts a new chain segment: %w",
		dir, p.Message, ActionAnchorReset, errdefs.ErrFailedPrecondition)
}

// VerifyAnchored is Verify, then a comparison of the log's end with a, the
// anchor kept in the state file: records cut from the end, a deleted
// audit.log or a changed newest record become a Problem (ProblemTruncated,
// ProblemChanged, ProblemUnanchored) that the chain alone cannot show. The
// zero Anchor checks nothing more than Verify.
//
// The anchor must be read before the log (or while no daemon writes it):
// a daemon appending between the two reads would look like a log that ran
// past its anchor.
func VerifyAnchored(dir string, a Anchor) (Report, error) {
	rep, err := Verify(dir)
	if err != nil || a.Seq == 0 {
		return rep, err
	}
	rep.Anchor = &a
	if !rep.OK {
		return rep, nil
	}
	if p := compareAnchor(rep.Head, rep.headPrev, a); p != nil {
		rep.OK, rep.Problem = false, p
	}
	return rep, nil
}

// ResetResult says what ResetAnchor did.
type ResetResult struct {
	// Reset is false when the log already matched its anchor; nothing was
	// written then.
	Reset bool `json:"reset"`
	// Problem is the mismatch that was accepted.
	Problem *Problem `json:"problem,omitempty"`
	// Record is the ActionAnchorReset record appended; the anchor now
	// points at it.
	Record *Record `json:"record,omitempty"`
	// Head is the log's newest record after the reset.
	Head Head `json:"head"`
}

// ResetAnchor accepts a log that no longer matches the anchor in
// opts.Anchor: it appends an ActionAnchorReset record (peer and reason as
// given, Detail naming the anchor, where the log ended and the problem),
// chained to the log's newest record, and anchors the log there. A log
// that matches its anchor is left alone. It takes the directory's lock, so
// it fails while a daemon has the log open; a log Open cannot read (a torn
// final line) must be repaired first.
func ResetAnchor(dir string, opts Options, peer, reason string) (ResetResult, error) {
	if opts.Anchor == nil {
		return ResetResult{}, fmt.Errorf("audit anchor reset without an anchor store: %w", errdefs.ErrInvalidArgument)
	}
	l, err := open(dir, opts, false)
	if err != nil {
		return ResetResult{}, err
	}
	defer l.Close()
	a, err := opts.Anchor.AuditAnchor()
	var p *Problem
	switch {
	case errdefs.IsFailedPrecondition(err):
		p = &Problem{Kind: ProblemCorrupt, Message: "the stored anchor cannot be read: " + err.Error()}
	case err != nil:
		return ResetResult{}, err
	default:
		p = compareAnchor(l.head, l.headPrev, a)
	}
	if p == nil {
		return ResetResult{Head: l.Head()}, nil
	}
	detail := map[string]any{
		"problem": p.Message, "kind": string(p.Kind), "reason": reason,
		"anchor_seq": a.Seq, "anchor_hash": a.Hash, "anchor_file": a.File,
		"log_seq": l.head.Seq, "log_hash": l.head.Hash,
	}
	if p.Kind == ProblemTruncated {
		detail["missing_first_seq"], detail["missing_last_seq"] = p.Seq, p.LastSeq
	}
	rec, err := l.Append(Record{Time: time.Now(), Peer: peer, Action: ActionAnchorReset, Outcome: OutcomeOK, Detail: detail})
	if err != nil {
		return ResetResult{}, err
	}
	if err := l.Close(); err != nil {
		return ResetResult{}, fmt.Errorf("audit log %s: %w", dir, err)
	}
	return ResetResult{Reset: true, Problem: p, Record: &rec, Head: Head{Seq: rec.Seq, Hash: l.head.Hash}}, nil
}
