package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/progress"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestProgressOutput runs the long CLI commands as a script would: with
// --json, stdout keeps the one result document and stderr carries NDJSON
// progress events; without, on a non-terminal stderr, plain lines.
func TestProgressOutput(t *testing.T) {
	c := newCLI(t)
	c.ok("daemon", "start") // so that stderr holds only progress
	tag := "it-prog-" + snapshot.NewID()

	// SNAPSHOT CREATE: its steps as events, the snapshot on stdout.
	out, errs, code := c.run("--json", "snapshot", "create", "--tag", tag, "--recipe", "minimal")
	if code != 0 {
		t.Fatalf("snapshot create --json: exit %d\n%s\n%s", code, out, errs)
	}
	defer c.run("rmi", tag)
	var snap apiv1.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil || snap.Tag != tag {
		t.Fatalf("snapshot create --json: stdout %q: %v", out, err)
	}
	evs := progressEvents(t, errs)
	if steps := eventsOf(evs, "step"); len(steps) < 2 || !strings.Contains(steps[len(steps)-1].Step, tag+" ready") {
		t.Errorf("snapshot create: steps %+v, want the engine's, the last saying %s is ready", steps, tag)
	}
	if last := evs[len(evs)-1]; last.Event != "done" || last.Op != "snapshot.create" || last.Error != "" {
		t.Errorf("snapshot create: last event %+v, want done without error", last)
	}

	// PACK: the archive's size is unknown until written; the final count
	// is the file's size.
	archive := filepath.Join(t.TempDir(), "a.forkd.tar.zst")
	out, errs, code = c.run("--json", "pack", tag, "-o", archive)
	if code != 0 {
		t.Fatalf("pack --json: exit %d\n%s\n%s", code, out, errs)
	}
	st, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	var packed struct{ Bytes int64 }
	if err := json.Unmarshal([]byte(out), &packed); err != nil || packed.Bytes != st.Size() {
		t.Fatalf("pack --json: stdout %q (%v), file of %d bytes", out, err, st.Size())
	}
	checkByteEvents(t, "pack", progressEvents(t, errs), st.Size(), false)

	// UNPACK: a local file, so the total is known from the start.
	utag := tag + "-u"
	out, errs, code = c.run("--json", "unpack", "--tag", utag, archive)
	if code != 0 {
		t.Fatalf("unpack --json: exit %d\n%s\n%s", code, out, errs)
	}
	defer c.run("rmi", utag)
	evs = progressEvents(t, errs)
	checkByteEvents(t, "unpack", evs, st.Size(), true)
	if steps := eventsOf(evs, "step"); len(steps) != 2 || !strings.Contains(steps[1].Step, "committing") {
		t.Errorf("unpack: steps %+v, want sending, then the daemon committing", steps)
	}

	// CP both ways, with a file of many reads.
	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
		t.Fatalf("fork: %+v %v", fr, err)
	}
	id := fr.Sandboxes[0].ID
	data := make([]byte, 8<<20)
	rand.Read(data)
	local := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(local, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code = c.run("--json", "cp", local, id+":/tmp/blob")
	if code != 0 {
		t.Fatalf("cp in --json: exit %d\n%s\n%s", code, out, errs)
	}
	checkByteEvents(t, "cp", progressEvents(t, errs), int64(len(data)), true)

	back := filepath.Join(t.TempDir(), "back")
	out, errs, code = c.run("--json", "cp", id+":/tmp/blob", back)
	if code != 0 {
		t.Fatalf("cp out --json: exit %d\n%s\n%s", code, out, errs)
	}
	checkByteEvents(t, "cp", progressEvents(t, errs), int64(len(data)), true) // the total from a stat first
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatalf("cp out: %d bytes back, not the %d sent", len(got), len(data))
	}

	// Without --json, stderr not a terminal: plain lines, the last with
	// the whole size.
	_, errs, code = c.run("cp", id+":/tmp/blob", back)
	if code != 0 {
		t.Fatalf("cp out: exit %d\n%s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], "] copying "+id+":/tmp/blob to ") ||
		!strings.Contains(lines[len(lines)-2], "]   8.0 MiB in ") || !strings.HasPrefix(lines[len(lines)-1], "copied 8.0 MiB to ") {
		t.Errorf("cp out, plain progress:\n%s", errs)
	}
}

// progressEvents parses stderr as NDJSON progress events.
func progressEvents(t *testing.T, stderr string) []progress.Event {
	t.Helper()
	var evs []progress.Event
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var ev progress.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Event == "" {
			t.Fatalf("stderr line %q is no progress event (%v); stderr:\n%s", line, err, stderr)
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		t.Fatal("no progress events on stderr")
	}
	return evs
}

func eventsOf(evs []progress.Event, kind string) []progress.Event {
	var out []progress.Event
	for _, ev := range evs {
		if ev.Event == kind {
			out = append(out, ev)
		}
	}
	return out
}

// checkByteEvents: byte counts that grow, the last one final and equal to
// size, with that total when known; then done without error.
func checkByteEvents(t *testing.T, op string, evs []progress.Event, size int64, totalKnown bool) {
	t.Helper()
	bs := eventsOf(evs, "bytes")
	if len(bs) < 2 {
		t.Fatalf("%s: %d bytes events, want a first and a final one: %+v", op, len(bs), evs)
	}
	for i, ev := range bs {
		if ev.Op != op || ev.Bytes == nil {
			t.Fatalf("%s: event %+v", op, ev)
		}
		if i > 0 && *ev.Bytes < *bs[i-1].Bytes {
			t.Errorf("%s: byte count went down: %d after %d", op, *ev.Bytes, *bs[i-1].Bytes)
		}
		if totalKnown != (ev.Total != nil) || (ev.Total != nil && *ev.Total != size) {
			t.Errorf("%s: event %+v: want total %d known %v", op, ev, size, totalKnown)
		}
	}
	if *bs[0].Bytes >= size {
		t.Errorf("%s: the first count is already %d of %d", op, *bs[0].Bytes, size)
	}
	if last := bs[len(bs)-1]; !last.Final || *last.Bytes != size {
		t.Errorf("%s: last bytes event %+v, want final with %d bytes", op, last, size)
	}
	if last := evs[len(evs)-1]; last.Event != "done" || last.Error != "" {
		t.Errorf("%s: last event %+v, want done without error", op, last)
	}
}
