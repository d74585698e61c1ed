package snapshot

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestStampsCatchAWrittenFile: a committed snapshot's files are stamped;
// a file whose times change afterwards (a write, a touch, a chmod) fails
// the check naming it; a snapshot without stamps passes.
func TestStampsCatchAWrittenFile(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	snap := commitOne(t, s, "a")
	if _, ok := snap.Files[StampFile]; ok {
		t.Fatal("the stamp file is hashed as a snapshot file")
	}
	if err := snap.CheckStamps(); err != nil {
		t.Fatalf("fresh snapshot: %v", err)
	}
	// Reading is not a change.
	if _, err := os.ReadFile(snap.Path(MemoryFile)); err != nil {
		t.Fatal(err)
	}
	if err := snap.CheckStamps(); err != nil {
		t.Fatalf("after a read: %v", err)
	}
	// A touch, even back to the recorded mtime, changes the ctime.
	st, _ := StampOf(snap.Path(MemoryFile))
	mt := time.Unix(0, st.MtimeNs)
	if err := os.Chtimes(snap.Path(MemoryFile), mt, mt); err != nil {
		t.Fatal(err)
	}
	err = snap.CheckStamps()
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "file memory changed") || !strings.Contains(err.Error(), "inode changed") {
		t.Fatalf("after a touch: %v", err)
	}

	b := commitOne(t, s, "b")
	f, err := os.OpenFile(b.Path(StateFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("X"), 0)
	f.Close()
	if err := b.CheckStamps(); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "file vmstate changed") {
		t.Fatalf("after a write: %v", err)
	}

	// An older snapshot, without stamps, is not checked.
	c := commitOne(t, s, "c")
	if err := os.Remove(c.Path(StampFile)); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckStamps(); err != nil {
		t.Fatalf("snapshot without stamps: %v", err)
	}
}
