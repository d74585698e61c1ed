package agentclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func server(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return NewHTTP(s.Client(), s.URL)
}

func TestProblemKeepsItsClass(t *testing.T) {
	for _, class := range errdefs.Classes {
		c := server(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(418) // the code, not the status, decides
			json.NewEncoder(w).Encode(agentapi.Problem{Status: 418, Detail: "detail for " + class.Code, Code: class.Code})
		})
		_, err := c.Stat(context.Background(), "/x")
		if !errors.Is(err, class.Err) {
			t.Errorf("%s: %v does not unwrap to its class", class.Code, err)
		}
		var pe *ProblemError
		if !errors.As(err, &pe) || pe.Problem.Detail != "detail for "+class.Code {
			t.Errorf("%s: %#v", class.Code, err)
		}
	}
}

func TestStatusWithoutProblem(t *testing.T) {
	for status, want := range map[int]error{
		404: errdefs.ErrNotFound, 405: errdefs.ErrInvalidArgument, 409: errdefs.ErrFailedPrecondition,
		501: errdefs.ErrNotImplemented, 503: errdefs.ErrUnavailable, 500: errdefs.ErrInternal,
	} {
		c := server(t, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "plain text", status)
		})
		if _, err := c.Info(context.Background()); !errors.Is(err, want) {
			t.Errorf("status %d: %v, want %v", status, err, want)
		}
	}
}

func TestExecStreamWithoutExitIsAnError(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.ExecEvent{Type: agentapi.EventStdout, Data: []byte("partial")})
		// The stream ends here, without an exit event.
	})
	var out bytes.Buffer
	_, err := c.Exec(context.Background(), agentapi.ExecRequest{Shell: "x"}, nil, &out, nil)
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("Exec = %v, want unavailable", err)
	}
	if out.String() != "partial" {
		t.Fatalf("stdout %q", out.String())
	}
}

// TestGoneSaysWhy: a stream cut because the sandbox went away fails with
// the reason Gone gives, not the connection's unexpected EOF.
func TestGoneSaysWhy(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(agentapi.ExecEvent{Type: agentapi.EventStdout, Data: []byte("partial")})
	})
	gone := fmt.Errorf("sandbox sb-1 was killed while the call ran: %w", errdefs.ErrFailedPrecondition)
	c.Gone = func() error { return gone }
	_, err := c.Exec(context.Background(), agentapi.ExecRequest{Shell: "x"}, nil, io.Discard, nil)
	if !errors.Is(err, gone) || !errdefs.IsFailedPrecondition(err) || err.Error() != "exec: "+gone.Error() {
		t.Fatalf("Exec = %v, want the Gone reason", err)
	}
	c.Gone = func() error { return nil } // still running: the connection's error
	if _, err := c.Exec(context.Background(), agentapi.ExecRequest{Shell: "x"}, nil, io.Discard, nil); !errdefs.IsUnavailable(err) {
		t.Fatalf("Exec = %v, want unavailable", err)
	}
}

func TestExecEvents(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		var req agentapi.ExecRequest
		if err := json.Unmarshal([]byte(r.Header.Get(agentapi.ExecHeader)), &req); err != nil || !req.Stdin || req.Shell != "cat" {
			t.Errorf("request header: %+v %v", req, err)
		}
		in, _ := io.ReadAll(r.Body)
		enc := json.NewEncoder(w)
		enc.Encode(agentapi.ExecEvent{Type: agentapi.EventStdout, Data: in})
		enc.Encode(agentapi.ExecEvent{Type: "progress"}) // unknown types are skipped
		enc.Encode(agentapi.ExecEvent{Type: agentapi.EventStderr, Data: []byte("e")})
		enc.Encode(agentapi.ExecEvent{Type: agentapi.EventExit, ExitCode: 7})
	})
	var out, errb bytes.Buffer
	ev, err := c.Exec(context.Background(), agentapi.ExecRequest{Shell: "cat"}, bytes.NewReader([]byte("in")), &out, &errb)
	if err != nil || ev.ExitCode != 7 || out.String() != "in" || errb.String() != "e" {
		t.Fatalf("%+v %v %q %q", ev, err, out.String(), errb.String())
	}
}

func TestTruncatedFileIsAnError(t *testing.T) {
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.Write([]byte("only ten b"))
		// The handler returns: the server closes the connection short.
	})
	n, err := c.ReadFile(context.Background(), "/f", io.Discard)
	if err == nil || !errdefs.IsUnavailable(err) {
		t.Fatalf("ReadFile = %d, %v; want an unavailable error", n, err)
	}
}

func TestTransportErrors(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Answers only after the client gave up (the minute bounds a hang).
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}))
	defer s.Close()
	c := NewHTTP(s.Client(), s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Info(ctx); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("deadline: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := c.Info(ctx); !errors.Is(err, errdefs.ErrCanceled) {
		t.Errorf("canceled: %v", err)
	}
	dead := NewHTTP(http.DefaultClient, "http://127.0.0.1:1")
	if _, err := dead.Info(context.Background()); !errdefs.IsUnavailable(err) {
		t.Errorf("unreachable: %v", err)
	}
}

func TestWriteFileMode(t *testing.T) {
	got := make(chan string, 1)
	c := server(t, func(w http.ResponseWriter, r *http.Request) {
		got <- fmt.Sprintf("%s %s %s", r.Method, r.URL.Query().Get("path"), r.URL.Query().Get("mode"))
		json.NewEncoder(w).Encode(agentapi.FileInfo{Name: "f"})
	})
	if _, err := c.WriteFile(context.Background(), "/a b/f", fs.ModeSetuid|0o755, bytes.NewReader(nil)); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != "PUT /a b/f 04755" {
		t.Fatalf("request: %s", g)
	}
}

// A terminal asked of an agent that does not list the pty feature (one
// forked from a snapshot an older forkd made, which would ignore the
// field) is refused before any exec; the agent's features are asked once.
func TestPTYNeedsTheAgentFeature(t *testing.T) {
	for _, feats := range [][]string{nil, {agentapi.FeaturePTY}} {
		var infos, execs int
		c := server(t, func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case agentapi.PathInfo:
				infos++
				json.NewEncoder(w).Encode(agentapi.Info{ProtocolVersion: agentapi.Version, Features: feats})
			case agentapi.PathExec:
				execs++
				w.Header().Set("Content-Type", "application/x-ndjson")
				json.NewEncoder(w).Encode(agentapi.ExecEvent{Type: agentapi.EventExit})
			default:
				w.WriteHeader(http.StatusNoContent)
			}
		})
		for range 2 {
			_, err := c.Exec(context.Background(), agentapi.ExecRequest{Argv: []string{"sh"}, PTY: &agentapi.PTY{Rows: 24, Cols: 80}}, nil, io.Discard, io.Discard)
			rerr := c.Resize(context.Background(), 7, agentapi.ResizeRequest{Rows: 24, Cols: 80})
			if feats == nil && (!errdefs.IsFailedPrecondition(err) || !errdefs.IsFailedPrecondition(rerr)) {
				t.Fatalf("an agent without pty: exec %v, resize %v; want failed_precondition", err, rerr)
			}
			if feats != nil && (err != nil || rerr != nil) {
				t.Fatalf("an agent with pty: exec %v, resize %v", err, rerr)
			}
		}
		if infos != 1 || (feats == nil) != (execs == 0) {
			t.Errorf("features %v: %d info calls (want 1), %d execs", feats, infos, execs)
		}
	}
}
