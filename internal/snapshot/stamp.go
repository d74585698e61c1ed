package snapshot

// Stamps: what the file system says about a snapshot's files when they
// were committed (size, modification and change times), kept in StampFile
// next to the manifest and compared on every fork. Files are hashed once,
// at commit; re-hashing gigabytes per fork is out of the question, but a
// stat is not. A VMM that opened a memory file read-write (QEMU 7.2 opens
// it as root before dropping privileges, so the descriptor stays
// writable even on a 0400 file) and wrote it changes its mtime and its
// ctime; the ctime cannot be set back by anyone but the kernel. A
// mismatch means the file may no longer be what was hashed: the file is
// hashed again and compared with the manifest, and only a different
// content refuses the snapshot. A stamp that changed while the content did
// not (a chown, an xattr, a data dir restored from a backup) is replaced,
// so the cost is one hash, once.
//
// The stamp file is not one of the snapshot's Files: it is not hashed, not
// part of the digest, and not packed (an archive's files get new stamps
// where they are unpacked). A snapshot without one (committed by an older
// forkd, or unpacked before stamps existed) is not checked.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// StampFile holds the stamps of a snapshot's files.
const StampFile = "stamps.json"

// FileStamp is what stat(2) says about a file that must not change.
type FileStamp struct {
	Size    int64 `json:"size"`
	MtimeNs int64 `json:"mtime_ns"`
	CtimeNs int64 `json:"ctime_ns"`
}

// StampOf stats path.
func StampOf(path string) (FileStamp, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return FileStamp{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return FileStamp{Size: st.Size, MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano()}, nil
}

// Diff describes how now differs from the recorded stamp s ("" if it
// does not).
func (s FileStamp) Diff(now FileStamp) string {
	var d []string
	if now.Size != s.Size {
		d = append(d, fmt.Sprintf("size %d, was %d", now.Size, s.Size))
	}
	if now.MtimeNs != s.MtimeNs {
		d = append(d, fmt.Sprintf("modified %s, was %s", stampTime(now.MtimeNs), stampTime(s.MtimeNs)))
	}
	if now.CtimeNs != s.CtimeNs {
		d = append(d, fmt.Sprintf("inode changed %s, was %s", stampTime(now.CtimeNs), stampTime(s.CtimeNs)))
	}
	return strings.Join(d, "; ")
}

func stampTime(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

type stampDoc struct {
	Version int                  `json:"version"`
	Files   map[string]FileStamp `json:"files"`
}

// WriteStamps records the stamps of the named files of dir in
// dir/StampFile (staged, fsynced, renamed). Call it once the files are in
// their final state (content synced, mode set): a later chmod changes the
// ctime too.
func WriteStamps(dir string, names []string) error {
	doc := stampDoc{Version: 1, Files: map[string]FileStamp{}}
	for _, n := range names {
		st, err := StampOf(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		doc.Files[n] = st
	}
	return writeStampDoc(dir, doc)
}

func writeStampDoc(dir string, doc stampDoc) error {
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, StampFile), append(data, '\n'), 0o400)
}

// CheckStamps compares the snapshot's files with the stamps recorded when
// they were committed. A file whose stamp differs is hashed again: if its
// content is still the manifest's, its new stamp is recorded and it
// passes; if not, the error is a FailedPrecondition naming the file and
// what changed. Any other error (a read failing) is returned as it is. A
// snapshot without stamps passes.
func (s *Snapshot) CheckStamps() error {
	data, err := os.ReadFile(s.Path(StampFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // not recorded
	}
	if err != nil {
		return fmt.Errorf("snapshot %q: %w", s.Tag, err)
	}
	var doc stampDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("snapshot %q: %s is corrupt (%v): %w", s.Tag, s.Path(StampFile), err, errdefs.ErrFailedPrecondition)
	}
	names := make([]string, 0, len(doc.Files))
	for n := range doc.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	restamped := false
	for _, n := range names {
		now, err := StampOf(s.Path(n))
		if err != nil {
			return fmt.Errorf("snapshot %q: file %s: %v: %w", s.Tag, n, err, errdefs.ErrFailedPrecondition)
		}
		d := doc.Files[n].Diff(now)
		if d == "" {
			continue
		}
		if err := s.reverify(n, now); err != nil {
			return fmt.Errorf("snapshot %q: file %s changed since it was committed (%s): %w", s.Tag, n, d, err)
		}
		doc.Files[n] = now
		restamped = true
	}
	if restamped {
		// Best effort: without it, the next check hashes again.
		_ = writeStampDoc(filepath.Dir(s.Path(StampFile)), doc)
	}
	return nil
}

// reverify hashes file n, whose stamp was before, and compares it with
// the manifest. The stamp must not change while it is hashed.
func (s *Snapshot) reverify(n string, before FileStamp) error {
	want, ok := s.Files[n]
	if !ok {
		return fmt.Errorf("it is not in the manifest: %w", errdefs.ErrFailedPrecondition)
	}
	size, sum, err := fsutil.HashFile(s.Path(n))
	if err != nil {
		return fmt.Errorf("hashing it again: %w", err)
	}
	if size != want.Size || sum != want.SHA256 {
		return fmt.Errorf("its content is not what was committed: %d bytes sha256 %s, manifest %d bytes %s: %w",
			size, sum, want.Size, want.SHA256, errdefs.ErrFailedPrecondition)
	}
	if after, err := StampOf(s.Path(n)); err != nil || after != before {
		return fmt.Errorf("it changed while it was hashed again: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}
