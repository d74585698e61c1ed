package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/progress"
)

func TestProgressFlag(t *testing.T) {
	t.Setenv("FORKD_PROGRESS", "bars")
	g := &globals{}
	newRootCmd(g)
	if _, err := g.reporter("pack", false); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "FORKD_PROGRESS") {
		t.Errorf("FORKD_PROGRESS=bars: %v, want an invalid argument naming the variable", err)
	}

	t.Setenv("FORKD_PROGRESS", "none")
	g = &globals{}
	root := newRootCmd(g)
	if g.progress.mode != progress.None {
		t.Errorf("FORKD_PROGRESS=none: mode %q", g.progress.mode)
	}
	if err := root.PersistentFlags().Set("progress", "plain"); err != nil || g.progress.mode != progress.Plain {
		t.Errorf("--progress plain: %v, mode %q", err, g.progress.mode)
	}
	if err := root.PersistentFlags().Set("progress", "fancy"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("--progress fancy: %v", err)
	}
}

// TestStepAtEOF: an upload's end starts the daemon's step, once, after
// the upload's final count.
func TestStepAtEOF(t *testing.T) {
	var out bytes.Buffer
	// A clock that stands still: the first count and the final one,
	// however slow the copy.
	still := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	rep := progress.New(progress.Options{Op: "unpack", Mode: progress.JSON, Out: &out, Now: func() time.Time { return still }})
	rep.Step("sending a")
	data := strings.Repeat("x", 100<<10)
	r := stepAtEOF(rep.Reader(strings.NewReader(data), int64(len(data))), rep, "committing")
	if n, err := io.Copy(io.Discard, r); err != nil || n != int64(len(data)) {
		t.Fatalf("copy: %d, %v", n, err)
	}
	r.Read(make([]byte, 1)) // a read after EOF starts nothing more
	rep.Done(nil)

	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var ev progress.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		s := ev.Event + " " + ev.Step
		if ev.Final {
			s += " final"
		}
		got = append(got, s)
	}
	want := []string{"step sending a", "bytes sending a", "bytes sending a final", "step committing", "done "}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("events %q, want %q", got, want)
	}
}
