package agentclient

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// hugeBody is what the hostile agent sends: far more than any limit, so a
// client that reads it all allocates several times this much.
const hugeBody = 128 << 20

// writeHuge writes prefix, filler up to hugeBody bytes, then suffix, from
// one reused buffer: the fake agent allocates next to nothing, so the
// TotalAlloc the test measures is the client's. It stops when the client
// hangs up.
func writeHuge(w io.Writer, prefix, suffix string) {
	if _, err := io.WriteString(w, prefix); err != nil {
		return
	}
	chunk := bytes.Repeat([]byte("A"), 64<<10) // valid base64 and string content
	for n := len(prefix); n < hugeBody; n += len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
	_, _ = io.WriteString(w, suffix)
}

// TestHugeRepliesAreRefused: a hostile agent answers every call with a
// 128 MiB JSON value. Each call must fail with an error that names the
// call and the limit, and allocate no more than a small multiple of that
// limit (a client without limits allocated ~5x the body: 640 MiB).
func TestHugeRepliesAreRefused(t *testing.T) {
	const obj, objEnd = `{"name":"`, `"}` + "\n"
	const list, listEnd = `[{"name":"`, `"}]` + "\n"
	const event, eventEnd = `{"type":"stdout","data":"`, `"}` + "\n"
	cases := []struct {
		name           string // the call's name in errors; text after "#" tells cases apart
		limit          int64
		prefix, suffix string
		call           func(c *Client) error
	}{
		{"info", maxReply, `{"agent_version":"`, objEnd, func(c *Client) error { _, err := c.Info(context.Background()); return err }},
		{"set identity", maxReply, `{"agent_version":"`, objEnd, func(c *Client) error {
			_, err := c.SetIdentity(context.Background(), agentapi.Identity{})
			return err
		}},
		{"list processes", maxReply, `[{"shell":"`, listEnd, func(c *Client) error { _, err := c.Processes(context.Background()); return err }},
		{"list /d", maxListReply, list, listEnd, func(c *Client) error { _, err := c.ListFiles(context.Background(), "/d"); return err }},
		{"stat /f", maxReply, obj, objEnd, func(c *Client) error { _, err := c.Stat(context.Background(), "/f"); return err }},
		{"mkdir /d", maxReply, obj, objEnd, func(c *Client) error {
			_, err := c.Mkdir(context.Background(), agentapi.MkdirRequest{Path: "/d"})
			return err
		}},
		{"write file /f", maxReply, obj, objEnd, func(c *Client) error {
			_, err := c.WriteFile(context.Background(), "/f", 0o644, strings.NewReader("x"))
			return err
		}},
		{"start python", maxRunCodeReply, `{"warm":{"stdout":"`, `"}}` + "\n", func(c *Client) error {
			_, err := c.StartPython(context.Background(), agentapi.PythonStartRequest{})
			return err
		}},
		{"run code", maxRunCodeReply, `{"stdout":"`, objEnd, func(c *Client) error {
			_, err := c.RunCode(context.Background(), agentapi.RunCodeRequest{Code: "x"})
			return err
		}},
		{"run code#stream", maxRunCodeReply, event, eventEnd, func(c *Client) error {
			_, err := c.RunCodeStream(context.Background(), agentapi.RunCodeRequest{Code: "x"}, io.Discard, io.Discard)
			return err
		}},
		{"exec", maxExecEvent, event, eventEnd, func(c *Client) error {
			_, err := c.Exec(context.Background(), agentapi.ExecRequest{Shell: "x"}, nil, io.Discard, io.Discard)
			return err
		}},
		// A call whose reply the client only drains.
		{"remove /f", maxReply, obj, objEnd, func(c *Client) error { return c.Remove(context.Background(), "/f", false) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if hugeBody < 4*tc.limit {
				t.Fatalf("the body (%d) must dwarf the limit (%d) for the allocation check to mean anything", hugeBody, tc.limit)
			}
			c := server(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.name == "exec" || tc.name == "run code#stream" {
					// One ordinary event first: the limit is per event.
					io.WriteString(w, `{"type":"stdout","data":"b2s="}`+"\n")
				}
				writeHuge(w, tc.prefix, tc.suffix)
			})
			alloc := measureAlloc(func() {
				err := tc.call(c)
				what, _, _ := strings.Cut(tc.name, "#")
				want := "agent reply to " + what + " exceeds " + mib(tc.limit)
				if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "the guest sent too much") {
					t.Errorf("err = %v, want one that starts %q and says the guest sent too much", err, want)
				}
				if !errdefs.IsFailedPrecondition(err) {
					t.Errorf("err = %v, want failed precondition", err)
				}
			})
			// The decoder's buffer doubles as it fills: its last size is
			// up to 2x the limit, all of them together up to 4x.
			if max := 4*tc.limit + 4<<20; alloc > uint64(max) {
				t.Errorf("allocated %d MiB for a %s limit, want at most %d MiB", alloc>>20, mib(tc.limit), max>>20)
			}
			t.Logf("allocated %.1f MiB (limit %s)", float64(alloc)/(1<<20), mib(tc.limit))
		})
	}
}

// TestHugeProblemIsCut: an error reply is read up to maxProblemBody only
// and still keeps its class.
func TestHugeProblemIsCut(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		writeHuge(w, `{"code":"not_found","detail":"`, `"}`)
	})
	alloc := measureAlloc(func() {
		if _, err := c.Stat(context.Background(), "/f"); !errdefs.IsNotFound(err) {
			t.Errorf("err = %v, want not found", err)
		}
	})
	if alloc > 4<<20 {
		t.Errorf("allocated %d MiB for an error reply", alloc>>20)
	}
}

// TestRepliesUpToTheLimitDecode: a reply up to its limit is not refused.
func TestRepliesUpToTheLimitDecode(t *testing.T) {
	// A reply the client drops, exactly at the limit.
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.Repeat(" ", maxReply-3)+"{}\n")
	})
	if err := c.Remove(context.Background(), "/f", false); err != nil {
		t.Fatalf("Remove: %v", err)
	}

	name := strings.Repeat("n", maxReply-64)
	c = server(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"name":"`+name+`"}`+"\n")
	})
	fi, err := c.Stat(context.Background(), "/f")
	if err != nil || fi.Name != name {
		t.Fatalf("Stat: %d bytes, %v", len(fi.Name), err)
	}
	// Events: many of them, each under the limit, add up to far more.
	c = server(t, func(w http.ResponseWriter, r *http.Request) {
		line := `{"type":"stdout","data":"` + strings.Repeat("A", maxExecEvent-64) + `"}` + "\n"
		for range 8 {
			io.WriteString(w, line)
		}
		io.WriteString(w, `{"type":"exit","exit_code":3}`+"\n")
	})
	n := &countWriter{}
	ev, err := c.Exec(context.Background(), agentapi.ExecRequest{Shell: "x"}, nil, n, nil)
	if err != nil || ev.ExitCode != 3 || n.n < 8*(maxExecEvent-64)*3/4 {
		t.Fatalf("Exec = %+v, %v after %d bytes", ev, err, n.n)
	}
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// measureAlloc returns the bytes allocated (by the whole process) while f
// ran.
func measureAlloc(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
