package snapshot

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestStampsCatchAWrittenFile: a committed snapshot's files are stamped;
// a file whose stamp changes afterwards is hashed again: the same content
// (a touch, a chmod) passes and is stamped anew, another content fails the
// check naming it, even with its mtime set back; a snapshot without
// stamps passes.
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
	// A touch back to the recorded mtime changes the ctime, not the
	// content: verified again, stamped anew.
	st, _ := StampOf(snap.Path(MemoryFile))
	mt := time.Unix(0, st.MtimeNs)
	if err := os.Chtimes(snap.Path(MemoryFile), mt, mt); err != nil {
		t.Fatal(err)
	}
	touched, _ := StampOf(snap.Path(MemoryFile))
	if touched == st {
		t.Fatal("a touch left the stamp as it was")
	}
	if err := snap.CheckStamps(); err != nil {
		t.Fatalf("after a touch (same content): %v", err)
	}
	data, err := os.ReadFile(snap.Path(StampFile))
	if err != nil || !strings.Contains(string(data), fmt.Sprint(touched.CtimeNs)) {
		t.Fatalf("the new stamp was not recorded (%v): %s", err, data)
	}

	// Another content fails, also with its mtime set back.
	b := commitOne(t, s, "b")
	old, _ := StampOf(b.Path(StateFile))
	f, err := os.OpenFile(b.Path(StateFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("X"), 0)
	f.Close()
	omt := time.Unix(0, old.MtimeNs)
	os.Chtimes(b.Path(StateFile), omt, omt)
	err = b.CheckStamps()
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "file vmstate changed") || !strings.Contains(err.Error(), "content is not what was committed") {
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
