// Package audit keeps forkd's audit log: an append-only, hash-chained JSON
// Lines record of every mutating API request and every sandbox lifecycle
// event the daemon decides on its own (a sandbox died, a sandbox expired).
// It records API actions for operators; it is not a debug log.
//
// # Records and the hash chain
//
// Each record is one line: the JSON encoding of [Record] followed by '\n'.
// Records are numbered from 1 without gaps ("seq"). A record's "prev" field is
// the lower-case hex SHA-256 of the previous record's line exactly as it is
// stored, without its trailing newline; the first record (seq 1) has prev
// [Genesis]. Hashing the stored bytes, not a re-encoding, means the chain
// never depends on how a JSON library orders keys or escapes strings.
//
// Seq and prev together tell the tampering apart (see [Verify]): a changed
// record breaks the prev of the record after it, a removed one leaves a gap in
// seq, an inserted one repeats a seq or breaks the link while the record
// after it still chains to the one before it.
//
// A hash chain cannot show that records were cut from the end (audit.log
// truncated, emptied or deleted, the newest rotated files removed), or
// that the last record was changed, without an anchor kept elsewhere. With
// [Options.Anchor] (the daemon passes its bbolt state file), [Log.Append]
// stores an [Anchor] (seq and hash of the newest record, and its file)
// after every record, [Open] refuses to start on a log that ends before its
// anchor, or differs from it, naming the missing records, and
// [VerifyAnchored] reports the same offline. An operator who accepts the
// loss runs [ResetAnchor] (`forkd audit reset-anchor --i-know`), which
// records the mismatch in the log itself ([ActionAnchorReset]) and anchors
// the log again.
//
// # Files and rotation
//
// A log lives in one directory. New records go to audit.log. When the next
// line would take audit.log past [Options.MaxFileBytes], audit.log is renamed
// to audit-<seq>.log, where <seq> is the seq of its first record, zero-padded
// to 20 digits so that names sort in chain order, and a new audit.log is
// started whose first record chains to the last record of the renamed file:
// the chain runs across files. audit.lock guards the directory against a
// second writer; audit.log.torn-* files are left by [Repair]. Rotated files
// are never deleted by this package; removing one is reported by Verify.
//
// # Durability
//
// [Log.Append] writes each line with one write(2) on an O_APPEND descriptor
// and fsyncs before it returns, so an acknowledged record survives a crash.
// A crash mid-write can leave an incomplete final line (one that was never
// acknowledged); [Open] then fails with an [errdefs.ErrFailedPrecondition]
// that names the file and line, and the operator runs `forkd audit verify`
// and `forkd audit repair`. Nothing is ever truncated or restarted silently.
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Genesis is the prev of the first record (seq 1): 64 zeros.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// MaxLineBytes bounds one record's line (without its newline). Append drops
// Detail from a record that would be longer, and refuses it if it still is.
const MaxLineBytes = 1 << 20

// Lifecycle actions recorded by the daemon itself rather than for a request.
// Request actions are named the same way, noun.verb ("sandbox.fork").
const (
	ActionSandboxDied    = "sandbox.died"
	ActionSandboxExpired = "sandbox.expired"
	// ActionSandboxDiscarded: a child of a fork that never answered (the
	// daemon died mid-fork) was killed at the next start.
	ActionSandboxDiscarded = "sandbox.discarded"
	// ActionBranchReady and ActionBranchFailed: a background (--no-wait)
	// branch ended, after its request was answered 202.
	ActionBranchReady  = "snapshot.branch_ready"
	ActionBranchFailed = "snapshot.branch_failed"
)

// OutcomeOK is the outcome of a request or event that succeeded; any other
// outcome is an errdefs code ("not_found", "internal", ...).
const OutcomeOK = "ok"

// Record is one audit log entry. Append fills in Seq and Prev, and Time when
// it is zero.
type Record struct {
	// Seq numbers the records of a log from 1, without gaps.
	Seq uint64 `json:"seq"`
	// Time is when the request arrived or the event happened, in UTC.
	Time time.Time `json:"time"`
	// RequestID is the API request's ID; empty for lifecycle events.
	RequestID string `json:"request_id"`
	// Token is the name (never the secret) of the API token used; empty
	// for the Unix socket and for lifecycle events.
	Token string `json:"token"`
	// Tenant is the tenant the request acted as (the token's, or
	// "default" for the Unix socket); empty for lifecycle events and for
	// requests refused by authentication. Records written before tenants
	// existed have none: the field is omitted when empty, and the chain
	// hashes each line as stored, so they verify unchanged.
	Tenant string `json:"tenant,omitempty"`
	// Peer describes the caller: a Unix peer's uid/pid or a remote address.
	Peer string `json:"peer"`
	// Action is what was asked or what happened, noun.verb.
	Action string `json:"action"`
	// Targets are the IDs acted on: sandbox IDs, snapshot tags, image digests.
	Targets []string `json:"targets"`
	// Outcome is OutcomeOK or the errdefs code of the failure.
	Outcome string `json:"outcome"`
	// Error is the failure's message, for a failed outcome.
	Error string `json:"error,omitempty"`
	// DurationMillis is how long the request took.
	DurationMillis float64 `json:"duration_ms"`
	// Detail holds action-specific facts (exit code, snapshot shape...).
	Detail map[string]any `json:"detail,omitempty"`
	// Prev is the hex SHA-256 of the previous record's line, or Genesis.
	Prev string `json:"prev"`
}

// OutcomeOf returns the Outcome and Error fields for a request's result.
func OutcomeOf(err error) (outcome, message string) {
	if err == nil {
		return OutcomeOK, ""
	}
	return errdefs.Code(err), err.Error()
}

// Head identifies the newest record of a log: its seq and the hash of its
// line (the prev the next record will carry). The zero Head is an empty log.
type Head struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// hashLine is the chain hash of one stored line, without its newline.
func hashLine(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:])
}

// validHash reports whether s is a lower-case hex SHA-256.
func validHash(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// encode returns r's line, without the newline. A record over MaxLineBytes
// loses its Detail (noted in Detail itself); if that is not enough it is
// refused.
func encode(r *Record) ([]byte, error) {
	line, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("audit record %s: %v: %w", r.Action, err, errdefs.ErrInvalidArgument)
	}
	if len(line) <= MaxLineBytes {
		return line, nil
	}
	r.Detail = map[string]any{"detail_dropped_bytes": len(line)}
	line, err = json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("audit record %s: %v: %w", r.Action, err, errdefs.ErrInvalidArgument)
	}
	if len(line) > MaxLineBytes {
		return nil, fmt.Errorf("audit record %s: %d bytes, over the %d-byte limit: %w", r.Action, len(line), MaxLineBytes, errdefs.ErrInvalidArgument)
	}
	return line, nil
}

// parseLine checks that line is a well-formed record and returns its seq and
// prev, or a description of what is wrong.
func parseLine(line []byte) (seq uint64, prev string, problem string) {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		return 0, "", "not a JSON record: " + err.Error()
	}
	switch {
	case r.Seq == 0:
		return 0, "", "no seq"
	case !validHash(r.Prev):
		return 0, "", "prev is not a hex SHA-256"
	case r.Action == "":
		return 0, "", "no action"
	}
	return r.Seq, r.Prev, ""
}
