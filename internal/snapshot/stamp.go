package snapshot

// Stamps: what the file system says about a snapshot's files when they
// were committed (size, modification and change times), kept in StampFile
// next to the manifest and compared on every fork. Files are hashed once,
// at commit; re-hashing gigabytes per fork is out of the question, but a
// stat is not. A VMM that opened a memory file read-write (QEMU 7.2 opens
// it as root before dropping privileges, so the descriptor stays
// writable even on a 0400 file) and wrote it changes its mtime and its
// ctime; the ctime cannot be set back by anyone but the kernel. A
// mismatch means the file is no longer what was hashed.
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
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, StampFile), append(data, '\n'), 0o400)
}

// CheckStamps compares the snapshot's files with the stamps recorded when
// they were committed. A mismatch is a FailedPrecondition naming the file
// and what changed; a snapshot without stamps passes.
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
	for _, n := range names {
		now, err := StampOf(s.Path(n))
		if err != nil {
			return fmt.Errorf("snapshot %q: file %s: %v: %w", s.Tag, n, err, errdefs.ErrFailedPrecondition)
		}
		if d := doc.Files[n].Diff(now); d != "" {
			return fmt.Errorf("snapshot %q: file %s changed since it was committed (%s): %w", s.Tag, n, d, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}
